"""A dense layer's LoRA with its shrink folded into the base GEMM: the layer's weight W (N, K) and every adapter's
lora_a stacked under it, W' = [W; A_0; A_1; ...] ((N + R), K, R = slices * max_loras * rank), so that one cuBLAS
GEMM gives y' = x @ W'.T: the base output in columns [0, N) and x @ A[s][l].T for every slice s and adapter slot l
in column N + (s * max_loras + l) * rank on. `folded_expand` then writes out = y'[:, :N] + scale * s_sel @ B.T, each
token reading only its own adapter's rank columns.

Why: at decode sizes the shrink is a memory-bound read of the adapters' lora_a; inside the GEMM it is read at
cuBLAS's bandwidth with no launch of its own and no second stream to wait for, and what is left, the expand, is one
small launch on the main stream. What it costs: (N + R) / N of the GEMM at every size (R / N is 15% for Qwen3's q/k/v
at 8 adapters of rank 32), so a server would fold only for decode batches.

The shrink's result is rounded to the weights' dtype by the GEMM's output, as vLLM's expand rounds its float32 buffer
on reading it. One program per (column tile, adapter group), looping over the group's row blocks of BLOCK_M; rows
whose group has no adapter (id -1) get the base columns copied, and so do rows in no group: vLLM pads a batch to a
captured graph's size and groups only the tokens it scheduled, the first ones, so every row of the output is written.
Column tiles do not straddle slices: every slice's N is a multiple of BLOCK_N.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .dense_config import DenseLayout

__all__ = ["fold_weight", "folded_expand"]


def fold_weight(weight: torch.Tensor, lora_a: Sequence[torch.Tensor]) -> torch.Tensor:
    """W' = [W; every slice's lora_a (max_loras, [1,] rank, K) as rows], the slices in order."""
    return torch.cat([weight, *(a.reshape(-1, weight.shape[1]) for a in lora_a)])


@triton.jit(do_not_specialize=["num_tokens"])
def _folded_expand_kernel(
    yp_ptr,  # (M, N + R): the base columns, then the folded shrink
    out_ptr,  # (M, N)
    b_ptrs,  # (NUM_SLICES,) int64 addresses of each slice's lora_b, (max_loras, [1,] N_s, rank)
    slice_col_ptr,  # (NUM_SLICES,) int32 each slice's first column
    b_lora_stride_ptr,  # (NUM_SLICES,) int64
    sorted_ptr,  # (M,) token indices grouped by adapter
    count_ptr,  # (G,) tokens per group
    start_ptr,  # (G + 1,) first position of each group in sorted_ptr
    ids_ptr,  # (G,) adapter slot per group, -1 for rows without one
    num_tokens,
    groups,
    N,
    rank,
    max_loras,
    scale,
    stride_ym,
    stride_om,
    stride_bn,
    NUM_SLICES: tl.constexpr,
    TABLE: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RANK_PAD: tl.constexpr,
):
    tile = tl.program_id(0)
    group = tl.program_id(1)
    lora = tl.load(ids_ptr + group)
    count = tl.where(group < groups, tl.load(count_ptr + group), 0)  # one program row even with no group
    first = tl.load(start_ptr + group)
    n0 = tile * BLOCK_N
    s = 0
    for i in tl.static_range(NUM_SLICES):
        s = tl.where(n0 >= tl.load(slice_col_ptr + i), i, s)
    col0 = tl.load(slice_col_ptr + s)
    cols = n0 + tl.arange(0, BLOCK_N)
    ranks = tl.arange(0, RANK_PAD)
    b_ptr = tl.load(b_ptrs + s).to(tl.pointer_type(out_ptr.dtype.element_ty))
    b_rows = tl.maximum(lora, 0) * tl.load(b_lora_stride_ptr + s) + (cols - col0)[None, :] * stride_bn + ranks[:, None]
    b_t = tl.load(b_ptr + b_rows, mask=ranks[:, None] < tl.where(lora >= 0, rank, 0), other=0.0)  # (RANK_PAD, BLOCK_N)
    for r0 in range(0, count, BLOCK_M):
        at = r0 + tl.arange(0, BLOCK_M)
        ok = at < count
        rows = tl.load(sorted_ptr + first + at, mask=ok, other=0)
        ok = ok & (rows < num_tokens)
        base = tl.load(yp_ptr + rows[:, None] * stride_ym + cols[None, :], mask=ok[:, None], other=0.0)
        out = base.to(tl.float32)
        if lora >= 0:
            shrink_col = N + (s * max_loras + lora) * rank
            sv = tl.load(
                yp_ptr + rows[:, None] * stride_ym + shrink_col + ranks[None, :],
                mask=ok[:, None] & (ranks[None, :] < rank),
                other=0.0,
            )
            out += scale * tl.dot(sv, b_t)
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out.to(base.dtype), mask=ok[:, None])
    if group == 0:
        # Rows past the grouped tokens start at the whole count table's sum (vLLM zeroes it every step), not at the
        # sum over the groups a CUDA graph was captured with, which a replay may outgrow.
        g = tl.arange(0, GROUPS_PAD)
        grouped = tl.sum(tl.load(count_ptr + g, mask=g < TABLE, other=0))
        for r0 in range(grouped, num_tokens, BLOCK_M):
            rows = r0 + tl.arange(0, BLOCK_M)
            ok = rows < num_tokens
            base = tl.load(yp_ptr + rows[:, None] * stride_ym + cols[None, :], mask=ok[:, None], other=0.0)
            tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], base, mask=ok[:, None])


def folded_expand(
    out: torch.Tensor,
    folded: torch.Tensor,
    layout: DenseLayout,
    meta: tuple,
    *,
    max_loras: int,
    scale: float = 1.0,
    block_n: int = 64,
    num_warps: int = 4,
) -> None:
    """out (M, N) = folded[:, :N] + scale * (each token's adapter's shrink columns) @ lora_b.T, per slice. folded:
    x @ fold_weight(W, lora_a).T; layout: dense_layout's tables of the same lora_a and lora_b. meta: dense_splitk's
    (sorted token indices, tokens per group, group starts, group adapter ids, number of groups)."""
    sorted_ids, counts, starts, ids, groups = meta
    n = sum(layout.widths)
    if any(w % block_n for w in layout.widths):
        raise ValueError(f"folded_expand: slice widths {layout.widths} are not multiples of block_n {block_n}")
    if out.shape[1] != n or folded.shape[1] != n + len(layout.widths) * max_loras * layout.rank:
        raise ValueError(f"folded_expand: {folded.shape[1]} columns in, {out.shape[1]} out, for slices {layout.widths}")
    _folded_expand_kernel[(n // block_n, max(groups, 1))](
        folded,
        out,
        layout.b_ptrs,
        layout.columns,
        layout.b_lora_strides,
        sorted_ids,
        counts,
        starts,
        ids,
        out.shape[0],
        groups,
        n,
        layout.rank,
        max_loras,
        scale,
        folded.stride(0),
        out.stride(0),
        layout.stride_bn,
        NUM_SLICES=len(layout.widths),
        TABLE=ids.numel(),
        GROUPS_PAD=triton.next_power_of_2(ids.numel()),
        BLOCK_M=16,
        BLOCK_N=block_n,
        RANK_PAD=max(16, triton.next_power_of_2(layout.rank)),
        num_warps=num_warps,
    )
