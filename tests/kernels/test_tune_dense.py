"""The dense-LoRA tuner's CPU-testable parts: its plan, its float64 reference against a per-token loop, and files
that vLLM's own lookup reads back (vLLM's dense kernels themselves need CUDA: tests/gpu and the H200 run)."""

import json

import pytest
import torch

from moelora.kernels.tools import tune_dense as td


def test_plan_covers_each_projection_once():
    buckets = td.plan(models=[td.DENSE_MODELS["gpt-oss-20b"]], ranks=[16, 32], max_loras=[8], ms=[1, 16])
    assert len(buckets) == 2 * 2 * 3 * 2  # ranks x ms x (qkv, o, router) x (shrink, expand)
    assert len({b.key for b in buckets}) == len(buckets)
    qkv = next(b for b in buckets if b.proj == "qkv")
    assert td.projections(qkv.model)["qkv"] == (2880, (4096, 512, 512))


@pytest.mark.parametrize("op, add_inputs", [("shrink", True), ("expand", True), ("expand", False)])
def test_reference_matches_a_per_token_loop(op, add_inputs):
    small = td.DenseModel("small", hidden=8, q_size=6, kv_size=2, experts=3)
    b = td.DenseBucket(small, "qkv", op, rank=4, max_loras=3, m=5, add_inputs=add_inputs)
    inp = td.make_inputs(b, device=torch.device("cpu"), dtype=torch.float32, seed=1)
    inp.out.normal_()  # what the adding epilogue adds to and the writing one overwrites
    inp.lora_map[2] = -1  # a token without an adapter is left alone
    got = td.reference(inp, op, scale=0.5 if op == "shrink" else 1.0, add_inputs=add_inputs)
    want = torch.zeros_like(got) if op == "shrink" else inp.out.double().clone()
    for t in range(b.m):
        lora = int(inp.lora_map[t])
        if lora < 0:
            continue
        col = 0
        for s, w in enumerate(inp.weights):
            if op == "shrink":
                want[s, t] = 0.5 * (w[lora, 0].double() @ inp.x[t].double())
            else:
                n = w.shape[2]
                product = w[lora, 0].double() @ inp.x[s, t].double()
                want[t, col : col + n] = product + (want[t, col : col + n] if add_inputs else 0)
                col += n
    torch.testing.assert_close(got, want)


def test_written_files_are_read_back_by_vllm(tmp_path, vllm_lookup):
    leaf_s = {
        "block_m": 16,
        "block_n": 32,
        "block_k": 64,
        "split_k": 4,
        "group_size_m": 8,
        "num_warps": 2,
        "num_ctas": 1,
        "num_stages": 3,
    }
    adding = {"block_m": 16, "block_n": 128, "block_k": 32, "num_warps": 4, "num_ctas": 1, "num_stages": 2}
    writing = {"block_m": 16, "block_n": 64, "block_k": 16, "num_warps": 2, "num_ctas": 1, "num_stages": 3}
    qkv = {"rank": 32, "max_loras": 8, "k": 2880, "slices": [4096, 512, 512]}
    state = {
        "buckets": {
            "a": {"result": {"config": leaf_s}, "bucket": {"op": "shrink", "m": 16, **qkv}},
            # the tuner's first runs measured the adding epilogue and wrote no `add_inputs`
            "b": {"result": {"config": adding}, "bucket": {"op": "expand", "m": 16, **qkv}},
            "c": {"result": {"config": adding}, "bucket": {"op": "expand", "m": 64, **qkv}},
            "d": {"result": {"config": writing}, "bucket": {"op": "expand", "m": 16, "add_inputs": False, **qkv}},
        }
    }
    files = td.write_dense_files(out_dir=tmp_path, state=state, device_name="NVIDIA H200")
    assert sorted(f.name for f in files) == [
        "NVIDIA_H200_EXPAND_FALSE.json",
        "NVIDIA_H200_EXPAND_TRUE.json",
        "NVIDIA_H200_SHRINK.json",
    ]

    def expand(vllm_utils, batch: int, add_inputs: bool) -> dict:
        return vllm_utils.get_lora_op_configs(
            "expand", max_loras=9, batch=batch, hidden_size=4096, rank=32, num_slices=3, add_inputs=add_inputs
        )

    with vllm_lookup(tmp_path) as vllm_utils:
        # exactly as vLLM's ops ask: max_loras = len(lora_ids) = 9, nearest m
        assert (
            vllm_utils.get_lora_op_configs("shrink", max_loras=9, batch=20, hidden_size=2880, rank=32, num_slices=3)
            == leaf_s
        )
        # each epilogue reads its own measurement, and the other's where it has none
        assert expand(vllm_utils, 16, add_inputs=False) == writing
        assert expand(vllm_utils, 16, add_inputs=True) == adding
        assert expand(vllm_utils, 64, add_inputs=False) == adding
        assert expand(vllm_utils, 64, add_inputs=True) == adding
    assert all(json.loads(f.read_text()) for f in files)  # valid JSON on disk


def test_cli_plans_and_refuses_without_cuda(tmp_path, capsys):
    assert (
        td.main(
            [
                "--model",
                "gpt-oss-20b",
                "--ranks",
                "32",
                "--max-loras",
                "8",
                "--m",
                "16",
                "--output",
                str(tmp_path),
                "--dry-run",
            ]
        )
        == 0
    )
    assert "6 buckets, 6 to measure" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert td.main(["--model", "gpt-oss-20b", "--output", str(tmp_path)]) == 2
