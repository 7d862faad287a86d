"""The MoE fold probe's GEMM (an experiment, kernels/moelora/kernels/tools/moe_fold_probe.py) computes what it times:
the base fused-MoE GEMM, and with the fold each pair's LoRA expand on its slice's columns, rows without an adapter
left at the base."""

from __future__ import annotations

import pytest
import torch

from moelora.kernels.tools.moe_fold_probe import GemmConfig, align, moe_gemm, reference


@pytest.mark.parametrize("slices", [1, 2])
def test_probe_gemm_matches_pytorch(slices: int) -> None:
    torch.manual_seed(slices)  # float16: the interpreter computes bfloat16 wrongly
    m, top_k, e, k, n, rank, loras = 6, 2, 4, 32, 64, 16, 3
    x = torch.randn(m, k).to(torch.float16)
    w = (torch.randn(e, n, k) / 4).to(torch.float16)
    topk_ids = torch.stack([torch.randperm(e)[:top_k] for _ in range(m)]).to(torch.int32)
    lora_map = torch.tensor([0, 2, -1, 1, 2, 0], dtype=torch.int32)
    s = torch.randn(m * top_k, slices, rank).to(torch.float16)
    lora_b = (torch.randn(slices, loras, e, n // slices, rank) / 4).to(torch.float16)
    fold = (s, lora_b, lora_map)
    sorted_ids, block_expert = align(topk_ids, lora_map, e, block_m=16)
    # Every pair in exactly one block of its own expert.
    listed = sorted_ids[sorted_ids < m * top_k].long()
    assert sorted(listed.tolist()) == list(range(m * top_k))
    assert torch.equal(block_expert.repeat_interleave(16)[sorted_ids < m * top_k].long(), topk_ids.reshape(-1)[listed])
    cfg = GemmConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1)
    for f in (None, fold):
        out = torch.full((m * top_k, n), float("nan")).to(torch.float16)
        moe_gemm(x, w, out, sorted_ids, block_expert, top_k=top_k, cfg=cfg, fold=f)
        torch.testing.assert_close(out.float(), reference(x, w, topk_ids, f), atol=3e-2, rtol=3e-2)
    # The fold added something on rows with an adapter and nothing on the row without one.
    base = reference(x, w, topk_ids)
    assert (out.float() - base).abs()[lora_map.repeat_interleave(top_k) >= 0].max() > 0.1
    torch.testing.assert_close(out.float()[4:6], base[4:6], atol=3e-2, rtol=3e-2)
