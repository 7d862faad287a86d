"""The base fused-MoE tuner's CPU-testable parts: its float64 reference against a per-token loop, the search with a
stand-in for vLLM's kernel (which needs CUDA), and files that vLLM's own lookup reads back by its own name."""

import json

import pytest
import torch

from moelora.kernels.tools import tune_moe as tm
from moelora.kernels.tools.tune import ModelShape

TINY = ModelShape("tiny", hidden=12, inter=8, experts=5, top_k=2, w13_slices=2)


def test_reference_matches_a_per_token_loop():
    inp = tm.make_inputs(tm.MoeBucket(TINY, 7), device=torch.device("cpu"), dtype=torch.float32, seed=3)
    got = tm.reference(inp)
    want = torch.zeros_like(got)
    for t in range(7):
        for slot in range(TINY.top_k):
            e = int(inp.topk_ids[t, slot])
            h = inp.w1[e].double() @ inp.x[t].double()
            act = torch.nn.functional.silu(h[: TINY.inter]) * h[TINY.inter :]
            want[t] += float(inp.topk_w[t, slot]) * (inp.w2[e].double() @ act)
    torch.testing.assert_close(got, want)


def stand_in(wrong_block_m: int):
    """vLLM's fused_experts in torch; with BLOCK_SIZE_M == wrong_block_m it drops each token's last expert, the way
    a tiling that skips blocks would."""

    def experts(inp: tm.MoeInputs, config: dict) -> torch.Tensor:
        keep = inp.topk_ids.shape[1] - (config["BLOCK_SIZE_M"] == wrong_block_m)
        part = tm.MoeInputs(
            inp.x, inp.w1, inp.w2, inp.topk_w[:, :keep], inp.topk_ids[:, :keep], torch.zeros_like(inp.out)
        )
        return tm.reference(part).to(inp.out.dtype)

    return experts


def start(b: tm.MoeBucket) -> dict:
    return {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 16,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }


def test_a_wrong_candidate_is_rejected_and_files_are_written_per_shape(tmp_path):
    other = ModelShape("other", hidden=8, inter=4, experts=3, top_k=1, w13_slices=2)
    logs: list[str] = []
    res = tm.tune_moe(
        buckets=tm.plan(models=[TINY, other], ms=[3, 9]),
        out_dir=tmp_path,
        space=tm.SPACES["tiny"],
        device=torch.device("cpu"),
        device_name="NVIDIA H200",
        experts=stand_in(wrong_block_m=32),
        start=start,
        cuda=False,
        dtype=torch.float32,
        passes=1,
        log=logs.append,
    )
    assert res["measured"] == 4 and res["left"] == 0
    assert sorted(p.rsplit("/", 1)[1] for p in res["files"]) == [
        "E=3,N=4,device_name=NVIDIA_H200.json",
        "E=5,N=8,device_name=NVIDIA_H200.json",
    ]
    state = json.loads((tmp_path / tm.STATE_FILE).read_text())
    for rec in state["buckets"].values():
        # BLOCK_SIZE_M 32 is the space's one wrong candidate: rejected in every bucket, never written
        assert rec["result"]["rejected"] == 1 and rec["result"]["config"]["BLOCK_SIZE_M"] == 16
    assert sum("wrong result" in line for line in logs) == 4
    tree = json.loads((tmp_path / "E=5,N=8,device_name=NVIDIA_H200.json").read_text())
    assert list(tree) == ["3", "9"] and set(tree["3"]) == set(tm.FIELDS)


def test_the_budget_stops_before_the_next_bucket_and_a_rerun_resumes(tmp_path):
    kwargs = dict(
        out_dir=tmp_path,
        space={"BLOCK_SIZE_N": (16, 32)},
        device=torch.device("cpu"),
        device_name="NVIDIA H100 80GB HBM3",
        experts=stand_in(wrong_block_m=0),
        start=start,
        cuda=False,
        dtype=torch.float32,
        log=lambda _: None,
    )
    buckets = tm.plan(models=[TINY], ms=[2, 4, 8])
    first = tm.tune_moe(buckets=buckets, budget_s=0.0, **kwargs)
    assert (first["measured"], first["left"]) == (1, 2)  # a run measures one bucket at least
    assert [p.rsplit("/", 1)[1] for p in first["files"]] == ["E=5,N=8,device_name=NVIDIA_H100_80GB_HBM3.json"]
    # The counts left out hold the start config (vLLM's choice), so vLLM's nearest-count lookup cannot hand them
    # the tuned count's config; the state marks them for the next run.
    tree = json.loads((tmp_path / "E=5,N=8,device_name=NVIDIA_H100_80GB_HBM3.json").read_text())
    assert list(tree) == ["2", "4", "8"] and tree["4"] == tree["8"] == start(buckets[1])
    assert "not tuned" in tm.report(json.loads((tmp_path / tm.STATE_FILE).read_text()))
    second = tm.tune_moe(buckets=buckets, **kwargs)
    assert (second["measured"], second["skipped"], second["left"]) == (2, 1, 0)
    assert "not tuned" not in tm.report(json.loads((tmp_path / tm.STATE_FILE).read_text()))


@pytest.mark.parametrize(
    ("torch_name", "file_name"),
    [
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200"),  # vLLM reads every H200 variant's files as NVIDIA_H200
        ("NVIDIA H20-3e", "NVIDIA_H20-3e"),  # '-' stays, unlike in the LoRA files' names
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
    ],
)
def test_device_file_name_is_vllms(torch_name, file_name, monkeypatch):
    from vllm.model_executor.layers.fused_moe import fused_moe
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils

    monkeypatch.setattr(current_platform, "get_device_name", lambda *a, **k: torch_name, raising=False)
    platform_utils.get_device_name_as_file_name.cache_clear()  # vLLM caches the name per process
    try:
        assert fused_moe.get_config_file_name(32, 2880, None) == f"E=32,N=2880,device_name={file_name}.json"
    finally:
        platform_utils.get_device_name_as_file_name.cache_clear()
    assert (
        tm.config_file_name(experts=32, inter=2880, device_name=torch_name)
        == f"E=32,N=2880,device_name={file_name}.json"
    )


def test_written_files_are_what_vllm_picks(tmp_path, monkeypatch):
    from vllm.model_executor.layers.fused_moe import fused_moe
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils

    small = {f: 16 for f in tm.FIELDS}
    large = {f: 64 for f in tm.FIELDS}
    state = {
        "buckets": {
            key: {"result": {"config": cfg}, "bucket": {"experts": 32, "inter": 2880, "m": m}}
            for key, cfg, m in (("a", small, 16), ("b", large, 1024))
        }
    }
    tm.write_files(out_dir=tmp_path, state=state, device_name="NVIDIA H200")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    monkeypatch.setattr(current_platform, "get_device_name", lambda *a, **k: "NVIDIA H200", raising=False)
    platform_utils.get_device_name_as_file_name.cache_clear()
    fused_moe.get_moe_configs.cache_clear()
    try:
        # exactly as vLLM's experts ask: w1 (E, 2N, K), w2 (E, K, N), top_k, bf16 (no dtype), the batch's tokens
        for tokens, want in ((1, small), (300, small), (900, large), (8192, large)):
            got = fused_moe.try_get_optimal_moe_config((32, 5760, 2880), (32, 2880, 2880), 4, None, tokens)
            assert got == want
    finally:
        fused_moe.get_moe_configs.cache_clear()
        platform_utils.get_device_name_as_file_name.cache_clear()


def test_a_failing_candidate_does_not_stay_forced(monkeypatch):
    """vLLM's override_config leaves the config set when the call raises; the tuner's call must not, or vLLM's own
    choice for the next token count (the search's start) would be the failed candidate."""
    from vllm.model_executor.layers import fused_moe as package
    from vllm.model_executor.layers.fused_moe import fused_moe

    def out_of_resources(*args, **kwargs):
        assert package.get_config() == {"BLOCK_SIZE_M": 128}
        raise RuntimeError("out of resource: shared memory")

    monkeypatch.setattr(fused_moe, "fused_experts", out_of_resources)
    inp = tm.make_inputs(tm.MoeBucket(TINY, 2), device=torch.device("cpu"), dtype=torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="shared memory"):
        tm.vllm_experts(inp, {"BLOCK_SIZE_M": 128})
    assert package.get_config() is None
