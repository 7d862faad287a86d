"""The dense LoRA with its shrink folded into the base GEMM, against the base GEMM plus PyTorch's shrink and expand:
rows without an adapter, several adapters, a group over two row blocks, two column tiles in a slice."""

from __future__ import annotations

import pytest
import torch

from moelora.kernels.dense_config import dense_layout
from moelora.kernels.dense_folded import fold_weight, folded_expand

from .test_dense_one_launch import _meta, _reference
from .test_dense_splitk import MIXED


def _case(widths: tuple[int, ...], k: int = 40, rank: int = 8, loras: int = 3):
    torch.manual_seed(len(widths))
    dtype, mapping = torch.float16, torch.tensor(MIXED)
    x = torch.randn(mapping.numel(), k, dtype=dtype)
    weight = torch.randn(sum(widths), k, dtype=dtype) / 4
    lora_a = [torch.randn(loras, 1, rank, k, dtype=dtype) / 4 for _ in widths]
    lora_b = [torch.randn(loras, 1, n, rank, dtype=dtype) / 4 for n in widths]
    return x, weight, lora_a, lora_b, mapping


@pytest.mark.parametrize("widths", [(32, 16, 16), (48,)])
def test_folded_matches_gemm_then_lora(widths: tuple[int, ...]) -> None:
    x, weight, lora_a, lora_b, mapping = _case(widths)
    folded = x @ fold_weight(weight, lora_a).T
    # The folded columns are the shrink: x @ A.T for every slice and slot, in that order.
    torch.testing.assert_close(
        folded[:, sum(widths) :], torch.cat([x @ a.reshape(-1, x.shape[1]).T for a in lora_a], 1)
    )
    out = torch.full((x.shape[0], sum(widths)), float("nan"), dtype=x.dtype)
    folded_expand(out, folded, dense_layout(lora_a, lora_b), _meta(mapping), max_loras=3, scale=1.0, block_n=16)
    want = (x @ weight.T).double() + _reference(x, lora_a, lora_b, mapping, 1.0)
    assert not torch.isnan(out).any()  # every row written, those without an adapter too
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    no_adapter = mapping < 0
    torch.testing.assert_close(out[no_adapter], folded[no_adapter, : sum(widths)], atol=0, rtol=0)


def test_folded_refuses_tiles_across_slices_and_the_wrong_width() -> None:
    x, weight, lora_a, lora_b, mapping = _case((24, 16))
    layout, out = dense_layout(lora_a, lora_b), torch.empty(x.shape[0], 40, dtype=x.dtype)
    folded = x @ fold_weight(weight, lora_a).T
    with pytest.raises(ValueError, match="multiples of block_n"):
        folded_expand(out, folded, layout, _meta(mapping), max_loras=3, block_n=16)
    with pytest.raises(ValueError, match="columns in"):
        folded_expand(out, folded[:, :-1], layout, _meta(mapping), max_loras=3, block_n=8)


@pytest.mark.parametrize("grouped", [18, 0])
def test_rows_past_the_grouped_tokens_get_the_base_columns(grouped: int) -> None:
    """vLLM pads a batch to a captured graph's size and groups only the tokens it scheduled, the first ones: the
    rows past them (5 here, or every row when no token is grouped) must hold the base output, not garbage."""
    x, weight, lora_a, lora_b, mapping = _case((32, 16))
    sorted_ids, counts, starts, ids, groups = _meta(mapping[:grouped])
    if not grouped:  # vLLM's table still has its entries, all counting zero tokens
        counts, ids, groups = torch.zeros(4, dtype=torch.long), torch.full((4,), -1), 0
    folded = x @ fold_weight(weight, lora_a).T
    out = torch.full((x.shape[0], 48), float("nan"), dtype=x.dtype)
    meta = (sorted_ids, counts, starts, ids, groups)
    folded_expand(out, folded, dense_layout(lora_a, lora_b), meta, max_loras=3, block_n=16)
    torch.testing.assert_close(out[grouped:], folded[grouped:, :48], atol=0, rtol=0)
    want = (x[:grouped] @ weight.T).double() + _reference(x[:grouped], lora_a, lora_b, mapping[:grouped], 1.0)
    torch.testing.assert_close(out[:grouped].double(), want, atol=2e-2, rtol=2e-2)
