"""Two w13 slices in one op (vLLM's Qwen3-MoE gate and up, each its own A and B) against the float64 reference, in
Triton's interpreter. Shapes are small and odd (K, N and rank off the tiles) so every mask is exercised; errors are
measured on the LoRA contribution alone, as in test_fused_moe_lora."""

from __future__ import annotations

import pytest
import torch

from moelora.kernels import KernelConfig, fused_moe_lora, moe_lora_reference

from .ops import TOL, delta_error, routing_of, run_op


def make_case(*, m, top_k, e, loras, rank, k, n, dtype, seed, none_frac=0.25):
    """Gate_up inputs with two slices: output (M, top_k, 2N), slice s in columns [s * N, (s + 1) * N)."""
    g = torch.Generator().manual_seed(seed)
    lora_map = torch.randint(0, loras, (m,), generator=g)
    lora_map[torch.rand(m, generator=g) < none_frac] = -1
    return {
        "x": torch.randn(m, k, generator=g).to(dtype),
        # Separate allocations, as vLLM's two slices are.
        "lora_a": tuple((torch.randn(loras, e, rank, k, generator=g) / k**0.5).to(dtype) for _ in range(2)),
        "lora_b": tuple(torch.randn(loras, e, n, rank, generator=g).to(dtype) for _ in range(2)),
        "topk_ids": torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32),
        "token_lora_mapping": lora_map,
        "topk_weights": torch.rand(m, top_k, generator=g),
        "output": torch.randn(m, top_k, 2 * n, generator=g).to(dtype),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "method, rank, k, n, cfg",
    [
        # grouped with readiness counters (both slices count into a block's one counter), split-K 3, ragged N tiles
        ("single", 12, 72, 40, KernelConfig(split_k=3, shrink_block_k=16, expand_block_n=16, expand_tiles=2)),
        # grouped, the grid-wide wait instead of the counters
        ("tiny", 8, 40, 24, KernelConfig(split_k=2, shrink_block_k=32, expand_block_n=16, wait_per_block=False)),
        # direct: one pair per block, vector math, two N tiles per CTA
        ("direct", 20, 56, 36, KernelConfig(split_k=2, shrink_block_k=16, expand_block_n=16, expand_tiles=2)),
    ],
)
def test_two_slices_in_one_op_match_the_reference(dtype, method, rank, k, n, cfg):
    case = make_case(m=9, top_k=3, e=5, loras=3, rank=rank, k=k, n=n, dtype=dtype, seed=rank)
    out = run_op(case, method=method, config=cfg)
    none = case["token_lora_mapping"] < 0
    assert torch.equal(out[none], case["output"][none])
    assert delta_error(case, out) < TOL[dtype]


@pytest.mark.parametrize("method", ["single", "direct"])
def test_one_op_gives_the_bits_of_one_op_per_slice(method):
    # The same arithmetic in the same order per slice: the one-launch op is what the plugin's two ops were, bit for
    # bit, and the down op after it (next readiness slot) still matches the reference.
    case = make_case(m=7, top_k=2, e=4, loras=2, rank=8, k=48, n=20, dtype=torch.float32, seed=3)
    cfg = KernelConfig(split_k=3, shrink_block_k=16, expand_block_n=16)
    one = case["output"].clone()
    routing = routing_of(case, method=method)
    fused_moe_lora(output=one, x=case["x"], lora_a=case["lora_a"], lora_b=case["lora_b"], routing=routing, config=cfg)
    g = torch.Generator().manual_seed(5)
    down = {
        "output": torch.randn(7, 2, 24, generator=g),
        "x": torch.randn(7, 2, 20, generator=g),
        "lora_a": torch.randn(2, 4, 8, 20, generator=g),
        "lora_b": torch.randn(2, 4, 24, 8, generator=g),
        "topk_weights": case["topk_weights"],
        "mul_routed_weight": True,
    }
    down_out = down["output"].clone()
    fused_moe_lora(**(down | {"output": down_out}), routing=routing, config=cfg)
    per_slice = case["output"].clone()
    routing = routing_of(case, method=method)
    for s, (a, b) in enumerate(zip(case["lora_a"], case["lora_b"], strict=True)):
        fused_moe_lora(
            output=per_slice[:, :, s * 20 : (s + 1) * 20], x=case["x"], lora_a=a, lora_b=b, routing=routing, config=cfg
        )
    assert torch.equal(one, per_slice)
    ref = moe_lora_reference(**down, topk_ids=case["topk_ids"], token_lora_mapping=case["token_lora_mapping"])
    err = ((down_out.double() - ref).norm() / (ref - down["output"].double()).norm()).item()
    assert err < TOL[torch.float32]


def test_rejects_mismatched_slices():
    case = make_case(m=4, top_k=2, e=3, loras=2, rank=8, k=32, n=16, dtype=torch.float32, seed=1)
    routing = routing_of(case, method="single")
    a0, a1 = case["lora_a"]
    common = {"x": case["x"], "routing": routing}
    with pytest.raises(ValueError, match="share shape"):
        fused_moe_lora(output=case["output"], lora_a=(a0, a1[:, :, :4]), lora_b=case["lora_b"], **common)
    with pytest.raises(ValueError, match="1 or 2 slices"):
        fused_moe_lora(output=case["output"], lora_a=(a0, a1), lora_b=case["lora_b"][:1], **common)
    with pytest.raises(ValueError, match="output must be"):
        fused_moe_lora(output=case["output"][:, :, :16], lora_a=(a0, a1), lora_b=case["lora_b"], **common)
