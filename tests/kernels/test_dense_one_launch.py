"""The one-launch dense LoRA against PyTorch: every slice and adapter group, rows without one, both epilogues."""

from __future__ import annotations

import pytest
import torch

from moelora.kernels.tools.dense_one_launch import dense_layout, dense_lora


def _meta(mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """What vLLM's LoRAKernelMeta.prepare_tensors derives from the token -> adapter slot mapping."""
    _, order = torch.sort(mapping, stable=True)
    ids, counts = torch.unique(mapping, sorted=True, return_counts=True)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
    return order, counts, starts, ids, int(ids.numel())


def _reference(x, lora_a, lora_b, mapping, scale):
    out = []
    for a, b in zip(lora_a, lora_b):
        part = torch.zeros(x.shape[0], b.shape[-2], dtype=torch.float64)
        for t, slot in enumerate(mapping.tolist()):
            if slot >= 0:
                h = (x[t].double() @ a[slot, 0].double().T * scale).to(x.dtype).double()
                part[t] = h @ b[slot, 0].double().T
        out.append(part)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("add", [True, False])
def test_one_launch_matches_shrink_then_expand(add: bool) -> None:
    torch.manual_seed(0)
    dtype, k, rank, widths, loras = torch.float16, 48, 8, (40, 16, 16), 3
    mapping = torch.tensor([2, -1, 0, 2, 2, -1, 1, 0] + [2] * 15)  # 18 rows of slot 2: two row blocks of 16
    x = torch.randn(mapping.numel(), k, dtype=dtype)
    lora_a = [torch.randn(loras, 1, rank, k, dtype=dtype) / 4 for _ in widths]
    lora_b = [torch.randn(loras, 1, n, rank, dtype=dtype) / 4 for n in widths]
    base = torch.randn(mapping.numel(), sum(widths), dtype=dtype)
    y = base.clone() if add else torch.full_like(base, float("nan"))  # written rows only: NaN stays where unwritten
    dense_lora(y, x, dense_layout(lora_a, lora_b), _meta(mapping), scale=0.5, add=add, block_n=16, tiles=2, block_k=16)
    want = _reference(x, lora_a, lora_b, mapping, 0.5) + (base.double() if add else 0.0)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)
