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


@pytest.mark.parametrize("op", ["shrink", "expand"])
def test_reference_matches_a_per_token_loop(op):
    small = td.DenseModel("small", hidden=8, q_size=6, kv_size=2, experts=3)
    b = td.DenseBucket(small, "qkv", op, rank=4, max_loras=3, m=5)
    inp = td.make_inputs(b, device=torch.device("cpu"), dtype=torch.float32, seed=1)
    inp.lora_map[2] = -1  # a token without an adapter is left alone
    got = td.reference(inp, op, scale=0.5 if op == "shrink" else 1.0)
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
                want[t, col : col + n] += w[lora, 0].double() @ inp.x[s, t].double()
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
    leaf_e = {"block_m": 16, "block_n": 128, "block_k": 32, "num_warps": 4, "num_ctas": 1, "num_stages": 2}
    state = {
        "buckets": {
            "a": {
                "result": {"config": leaf_s},
                "bucket": {"op": "shrink", "rank": 32, "max_loras": 8, "m": 16, "k": 2880, "slices": [4096, 512, 512]},
            },
            "b": {
                "result": {"config": leaf_e},
                "bucket": {"op": "expand", "rank": 32, "max_loras": 8, "m": 16, "k": 2880, "slices": [4096, 512, 512]},
            },
        }
    }
    files = td.write_dense_files(out_dir=tmp_path, state=state, device_name="NVIDIA H200")
    assert sorted(f.name for f in files) == ["NVIDIA_H200_EXPAND_TRUE.json", "NVIDIA_H200_SHRINK.json"]
    with vllm_lookup(tmp_path) as vllm_utils:
        # exactly as vLLM's ops ask: max_loras = len(lora_ids) = 9, nearest m
        assert (
            vllm_utils.get_lora_op_configs("shrink", max_loras=9, batch=20, hidden_size=2880, rank=32, num_slices=3)
            == leaf_s
        )
        assert (
            vllm_utils.get_lora_op_configs(
                "expand", max_loras=9, batch=16, hidden_size=4096, rank=32, num_slices=3, add_inputs=True
            )
            == leaf_e
        )
    assert json.loads(files[0].read_text())  # valid JSON on disk


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
