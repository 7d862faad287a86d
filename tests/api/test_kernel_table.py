"""moelora's tuned kernel table (moelora.api.kernel_table): the bundled table is what the schema says, read and
written back byte for byte; a malformed one is refused by the field; the merge script writes tables the schema
reads."""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
from typing import Any

import pytest

from moelora.api.kernel_table import EntryConfig, KernelTable, KernelTableError, TableEntry

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "kernels" / "moelora" / "kernels" / "configs" / "NVIDIA_H200.json"


def _merge_script() -> Any:
    spec = importlib.util.spec_from_file_location("merge_configs", ROOT / "kernels" / "scripts" / "merge_configs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bundled_table_parses_and_dumps_back_byte_for_byte() -> None:
    text = BUNDLED.read_text()
    table = KernelTable.parse(text, origin=BUNDLED.name)
    assert table.dump() == text
    # The file's variety is what the schema has to carry: entries with and without a route, configs naming
    # different subsets of the parameters, and nulls that mean "the kernel decides".
    assert {e.route for e in table.entries} == {"grouped", "direct"}
    assert len({tuple(e.config.model_fields_set) for e in table.entries}) > 1
    assert any(e.config.shrink_maxnreg is not None for e in table.entries)


def test_a_dump_writes_only_the_fields_a_table_was_given() -> None:
    entry = {"k": 8, "n": 16, "rank": 4, "num_experts": 2, "max_loras": 1, "m": 1, "config": {"split_k": 2}}
    table = KernelTable.parse(json.dumps({"entries": [entry]}), origin="t.json")
    assert json.loads(table.dump()) == {"entries": [entry]}
    assert table.entries[0].route == "grouped" and table.entries[0].config.shrink_block_k == 64  # defaults, unwritten


def _entry() -> dict[str, Any]:
    return copy.deepcopy(json.loads(BUNDLED.read_text())["entries"][0])


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    entry = _entry()
    node: Any = entry
    for part in path[:-1]:
        node = node[part]
    if value is _DROP:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return {"device": "NVIDIA H200", "entries": [_entry(), entry]}


_DROP = object()


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("m",), _DROP, "entries[1].m: Field required"),
        (("config", "split_k"), 2.5, "entries[1].config.split_k: Input should be a valid integer (got 2.5)"),
        (("config", "split_k"), "4", "entries[1].config.split_k: Input should be a valid integer"),
        (("config", "split_kk"), 4, "entries[1].config.split_kk: Extra inputs are not permitted"),
        (("rank",), 0, "entries[1].rank: Input should be greater than or equal to 1"),
        (("route",), "onepass", "entries[1].route: Input should be 'grouped' or 'direct'"),
        (("config", "pdl"), 1, "entries[1].config.pdl: Input should be a valid boolean"),
        (("config",), [], "entries[1].config: Input should be an object"),
    ],
    ids=["missing", "float", "string", "unknown", "zero", "route", "pdl", "config"],
)
def test_a_malformed_entry_is_refused_by_its_field(path: tuple[str, ...], value: Any, says: str) -> None:
    with pytest.raises(KernelTableError) as caught:
        KernelTable.parse(json.dumps(_with(path, value)), origin="tuned/NVIDIA_H200.json")
    assert str(caught.value).startswith("tuned/NVIDIA_H200.json: not a moelora kernel table: ")
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "the table: Invalid JSON"),
        ("[]", "the table: Input should be an object"),
        ('{"device": "NVIDIA H200"}', "entries: Field required"),
        (json.dumps(_with(("config", "split_k"), 7)), "entries[1] and entries[0] tune the same problem"),
    ],
    ids=["not-json", "not-an-object", "no-entries", "conflicting"],
)
def test_a_malformed_table_is_refused(text: str, says: str) -> None:
    with pytest.raises(KernelTableError, match="^t.json: ") as caught:
        KernelTable.parse(text, origin="t.json")
    assert says in str(caught.value)


def test_an_entry_repeated_with_the_same_config_is_no_conflict() -> None:
    table = KernelTable.parse(json.dumps({"entries": [_entry(), _entry()]}), origin="t.json")
    assert table.entries[0] == table.entries[1]


def test_merging_replaces_the_same_problem_and_keeps_the_rest(tmp_path: pathlib.Path) -> None:
    bundled = KernelTable.parse(BUNDLED.read_text(), origin=BUNDLED.name)
    first = bundled.entries[0]
    retuned = first.model_copy(update={"config": EntryConfig(split_k=first.config.split_k + 1)})
    new = TableEntry(k=1, n=1, rank=1, num_experts=1, max_loras=1, m=1, config=EntryConfig())  # sorts first
    tuned = KernelTable(device="NVIDIA H200", source="a test", entries=(retuned, new))
    (tmp_path / "tuned.json").write_text(tuned.dump())
    (tmp_path / "bundled.json").write_text(BUNDLED.read_text())

    _merge_script().main(str(tmp_path / "tuned.json"), str(tmp_path / "bundled.json"))

    merged = KernelTable.parse((tmp_path / "bundled.json").read_text(), origin="merged")
    expected = {e.key(): e for e in bundled.entries} | {retuned.key(): retuned, new.key(): new}
    assert merged.entries == tuple(expected[key] for key in sorted(expected))
    assert merged.source == f"{bundled.source}; merged: a test" and merged.device == bundled.device


def test_merging_a_malformed_table_names_it(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tuned.json").write_text(json.dumps(_with(("config", "shrink_warps"), None)))
    (tmp_path / "bundled.json").write_text(BUNDLED.read_text())
    with pytest.raises(KernelTableError, match=r"tuned\.json: .*entries\[1\]\.config\.shrink_warps"):
        _merge_script().main(str(tmp_path / "tuned.json"), str(tmp_path / "bundled.json"))
    assert (tmp_path / "bundled.json").read_text() == BUNDLED.read_text()
