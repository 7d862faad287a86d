"""The folded dense LoRA's GPU half without vLLM (the bare device image runs it, call1.sh's way): one GEMM over the
weight with every adapter's lora_a under it and `folded_expand`, captured in a CUDA graph, against a float64 oracle
in bf16: 13 tokens grouped of a batch padded to 16, rows without an adapter among them; then a slot's lora_a written
in place into the folded weight after the capture (as vLLM's set_lora writes its views), which the replay must read.

Run as tests/gpu is (its own pytest process, PYTHONPATH=kernels:image, no TRITON_INTERPRET)."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter forced"),
]


def _meta(mapping: torch.Tensor, table: int) -> tuple:
    """vLLM's LoRAKernelMeta tables for this mapping: int32, `table` entries (max_loras + 1), unused ones counting 0
    tokens with id -1, the group count launched being the whole table as vLLM's default is."""
    dev = mapping.device
    order = torch.sort(mapping, stable=True).indices.to(torch.int32)
    ids, counts = torch.unique(mapping, sorted=True, return_counts=True)
    id_table = torch.full((table,), -1, dtype=torch.int32, device=dev)
    id_table[: ids.numel()] = ids
    count_table = torch.zeros(table, dtype=torch.int32, device=dev)
    count_table[: ids.numel()] = counts
    starts = torch.zeros(table + 1, dtype=torch.int32, device=dev)
    starts[1 : ids.numel() + 1] = torch.cumsum(counts, 0)
    return order, count_table, starts, id_table, table


@pytest.mark.parametrize("widths", [(4096, 512, 512), (2880,)], ids=["qkv", "o"])
def test_folded_gemm_and_expand_replayed_match_the_oracle_and_read_lora_a_written_after_capture(widths):
    from moelora.kernels.dense_config import dense_layout
    from moelora.kernels.dense_folded import fold_weight, folded_expand

    dev, dt, m, loras, rank, k = "cuda", torch.bfloat16, 16, 8, 32, 2880
    g = torch.Generator(device=dev).manual_seed(2)
    n = sum(widths)
    weight = (torch.randn(n, k, generator=g, device=dev) / 64).to(dt)
    bias = torch.randn(n, generator=g, device=dev).to(dt)
    lora_a = [(torch.randn(loras, 1, rank, k, generator=g, device=dev) / 16).to(dt) for _ in widths]
    lora_b = [(torch.randn(loras, 1, w, rank, generator=g, device=dev) / 16).to(dt) for w in widths]
    folded = fold_weight(weight, lora_a)
    views = [
        folded[n + i * loras * rank : n + (i + 1) * loras * rank].view(loras, 1, rank, k) for i in range(len(widths))
    ]
    padded_bias = torch.cat([bias, torch.zeros(folded.shape[0] - n, dtype=dt, device=dev)])
    layout = dense_layout(views, lora_b)
    mapping = torch.tensor([3, -1, 0, 7, 7, -1, 1, 0, 2, 2, 5, -1, 4], device=dev, dtype=torch.int32)  # 13 of 16
    meta = _meta(mapping, loras + 1)
    block_n = 64 if len(widths) > 1 else 32

    def step(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(m, n, dtype=dt, device=dev)
        both = torch.nn.functional.linear(x, folded, padded_bias)
        folded_expand(out, both, layout, meta, max_loras=loras, block_n=block_n)
        return out

    def oracle(x: torch.Tensor) -> torch.Tensor:
        out = x.double() @ weight.double().T + bias.double()
        for t, lora in enumerate(mapping.tolist()):
            cols = 0
            for a_s, b_s, w in zip(views, lora_b, widths, strict=True):
                if lora >= 0:
                    out[t, cols : cols + w] += (x[t].double() @ a_s[lora, 0].double().T) @ b_s[lora, 0].double().T
                cols += w
        return out

    x = torch.randn(m, k, generator=g, device=dev).to(dt)
    torch.testing.assert_close(step(x).double(), oracle(x), atol=3e-2, rtol=3e-2)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(static_x)
    static_x.copy_(torch.randn(m, k, generator=g, device=dev).to(dt))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out.double(), oracle(static_x), atol=3e-2, rtol=3e-2)
    # A new adapter in slot 0 (rows 2 and 7), written in place as vLLM's set_lora writes lora_a_stacked.
    before = static_out[2].clone()
    for view in views:
        view[0, 0].copy_((torch.randn(rank, k, generator=g, device=dev) / 16).to(dt))
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(static_out[2], before)
    torch.testing.assert_close(static_out.double(), oracle(static_x), atol=3e-2, rtol=3e-2)
