"""The kernels read their tuned table through its schema (moelora.api.kernel_table): the tuner's file is what
default_config reads, the schema's defaults are KernelConfig's, and a malformed mounted table fails by its field
(it reaches the kernels unchecked from a user's kernel-config ConfigMap)."""

import dataclasses
import json

import pytest
import torch

from moelora.api.kernel_table import EntryConfig, KernelTable, KernelTableError
from moelora.kernels import KernelConfig, default_config, launch_config, table_token_counts
from moelora.kernels.routing import moe_lora_routing
from moelora.kernels.tools import tune

CPU = torch.device("cpu")
E, TOP_K, LORAS = 8, 2, 2


def routing(m: int, *, max_loras: int = LORAS):
    topk_ids = torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(i))[:TOP_K] for i in range(m)])
    return moe_lora_routing(
        topk_ids=topk_ids.to(torch.int32),
        token_lora_mapping=torch.zeros(m, dtype=torch.int32),
        num_experts=E,
        max_loras=max_loras,
        block_m=16,
    )


def test_the_schemas_config_is_kernel_config_field_for_field():
    ours = {f.name: f.default for f in dataclasses.fields(KernelConfig)}
    schema = {name: field.default for name, field in EntryConfig.model_fields.items()}
    assert list(schema.items()) == list(ours.items())


def _bucket(m: int, split_k: int) -> dict:
    bucket = {"model": "t", "op": "w13", "rank": 8, "max_loras": LORAS, "m": m, "k": 32, "n": 16, "hidden": 32}
    config = dataclasses.asdict(KernelConfig(split_k=split_k)) | {"pdl": None}  # as OursKernel.to_json writes it
    return {"kernel": "ours", "bucket": bucket | {"experts": E, "slices": 1}, "result": {"config": config}}


def test_the_tuners_table_is_what_default_config_reads(tmp_path):
    state = {"buckets": {"b8": _bucket(8, split_k=3), "b1": _bucket(1, split_k=2)}}
    (path,) = tune.write_outputs(out_dir=tmp_path, state=state, device_name="Fake GPU", source="test")

    table = KernelTable.parse(path.read_text(), origin=path.name)
    assert table.dump() == path.read_text()
    assert [e.m for e in table.entries] == [1, 8]  # sorted by the schema's key
    for m, split_k in ((1, 2), (6, 3)):  # 6 tokens: nearest on a log scale is the m=8 entry
        got = default_config(routing=routing(m), k=32, n=16, rank=8, device=CPU, config_file=path)
        assert got == KernelConfig(split_k=split_k)


def test_a_config_names_only_some_fields_and_kernel_config_fills_the_rest(tmp_path):
    entry = {"k": 32, "n": 16, "rank": 8, "num_experts": E, "max_loras": LORAS, "m": 4, "config": {"split_k": 5}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"entries": [entry | {"route": "direct"}, entry]}))
    assert default_config(routing=routing(4), k=32, n=16, rank=8, device=CPU, config_file=path) == KernelConfig(
        split_k=5
    )


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"split_k": 2.0}, "config.split_k"),
        ({"splitk": 2}, "config.splitk"),
        ({"expand_maxnreg": 0}, "config.expand_maxnreg"),
    ],
)
def test_a_malformed_table_fails_by_its_field(tmp_path, monkeypatch, config, field):
    entry = {"k": 32, "n": 16, "rank": 8, "num_experts": E, "max_loras": LORAS, "m": 4, "config": config}
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text(json.dumps({"entries": [entry]}))
    with pytest.raises(KernelTableError, match=rf"NVIDIA_H200\.json: .*entries\[0\]\.{field}"):
        default_config(routing=routing(4), k=32, n=16, rank=8, device=CPU, config_file=path)
    monkeypatch.setattr(launch_config, "_config_file", lambda device: path)  # the plugin's warm-up reads it first
    with pytest.raises(KernelTableError, match=rf"entries\[0\]\.{field}"):
        table_token_counts(CPU)


def test_a_problem_seen_before_is_answered_without_the_table_or_the_device(tmp_path, monkeypatch):
    """The lookup runs for every op of every eager forward (warm-ups, capture, prefill steps): after the first call
    for a problem it reads neither the table nor the GPU's name again."""
    entry = {"k": 32, "n": 16, "rank": 8, "num_experts": E, "max_loras": LORAS, "m": 4, "config": {"split_k": 3}}
    (tmp_path / "NVIDIA_H200.json").write_text(json.dumps({"entries": [entry]}))
    names, reads = [], []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: names.append(device) or "NVIDIA H200")
    loaded = launch_config._load_configs
    monkeypatch.setattr(launch_config, "_load_configs", lambda path: reads.append(path) or loaded(path))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    for cached in (launch_config._device_name, launch_config._named_file, launch_config._nearest):
        cached.cache_clear()
    cuda = torch.device("cuda", 0)
    first = launch_config._tuned_config(routing=routing(4), k=32, n=16, rank=8, device=cuda)
    again = [launch_config._tuned_config(routing=routing(4), k=32, n=16, rank=8, device=cuda) for _ in range(3)]
    assert first == KernelConfig(split_k=3) and again == [first] * 3
    assert (names, reads) == ([0], [tmp_path / "NVIDIA_H200.json"])
    # Another problem is looked up in the table (already parsed), not answered from the first one's entry.
    other = launch_config._tuned_config(routing=routing(4, max_loras=4), k=32, n=16, rank=8, device=cuda)
    assert other == KernelConfig(split_k=3) and len(reads) == 2
