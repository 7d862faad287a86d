"""An experiment, not served: a dense layer's LoRA (attention and other linear layers) as one launch,
y[t, slice] (+)= scale * (x[t] @ A[l].T) @ B[l].T, measured against vLLM's launches by bench_dense.

vLLM runs a dense layer's LoRA as a zero fill, a shrink into a float32 buffer and an expand (and, on its second
stream, one more fill of the output). Here one kernel does all of it: a program owns a run of column tiles of one
slice for one adapter and computes that adapter's rank-wide intermediate for its rows itself, over all of K. Rows of
the no-adapter group (id -1) get zeros when the kernel writes (`add=False`), so the output needs no fill first. The
token grouping is vLLM's (`LoRAKernelMeta.meta_args`). On an H200 it is slower than vLLM's tuned two launches at
every decode size (docs/benchmarks.md): a program's walk over K is serial, where vLLM's shrink splits K across
programs; kept as the baseline that split K (moelora.kernels.dense_splitk, served) is measured against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dense_config import DenseLayout, dense_layout

__all__ = ["DenseLayout", "dense_layout", "dense_lora"]


@triton.jit(do_not_specialize=["num_tokens"])
def _dense_lora_kernel(
    x_ptr,  # (M, K)
    y_ptr,  # (M, sum of the slices' N)
    a_ptrs,  # (S,) int64 addresses of each slice's lora_a, (max_loras, [1,] rank, K)
    b_ptrs,  # (S,) int64 addresses of each slice's lora_b, (max_loras, [1,] N_s, rank)
    slice_n_ptr,  # (S,) int32 each slice's N
    slice_col_ptr,  # (S,) int32 each slice's first column in y
    b_lora_stride_ptr,  # (S,) int64 lora_b's stride between adapters (N_s * rank when contiguous)
    sorted_ptr,  # (M,) token indices grouped by adapter
    count_ptr,  # (groups,) tokens per group
    start_ptr,  # (groups + 1,) first position of each group in sorted_ptr
    ids_ptr,  # (groups,) adapter slot per group, -1 for rows without one
    num_tokens,
    K,
    rank,
    scale,
    stride_xm,
    stride_ym,
    stride_al,
    stride_ar,
    stride_bn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RANK_PAD: tl.constexpr,
    TILES: tl.constexpr,
    ADD: tl.constexpr,
):
    pid_n = tl.program_id(0)
    slice_id = tl.program_id(1)
    group = tl.program_id(2)
    n = tl.load(slice_n_ptr + slice_id)
    if pid_n * BLOCK_N * TILES >= n:
        return
    lora = tl.load(ids_ptr + group)
    count = tl.load(count_ptr + group)
    first = tl.load(start_ptr + group)
    if lora == -1 and ADD:
        return
    dtype = y_ptr.dtype.element_ty
    column0 = tl.load(slice_col_ptr + slice_id)
    ranks = tl.arange(0, RANK_PAD)
    rank_ok = ranks < rank
    a_base = tl.load(a_ptrs + slice_id).to(tl.pointer_type(dtype)) + lora * stride_al
    b_base = tl.load(b_ptrs + slice_id).to(tl.pointer_type(dtype)) + lora * tl.load(b_lora_stride_ptr + slice_id)
    for m0 in range(0, count, BLOCK_M):
        offs = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs < count
        rows = tl.load(sorted_ptr + first + offs, mask=row_ok, other=0)
        if lora == -1:
            for t in range(TILES):
                cols = (pid_n * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
                out_ptrs = y_ptr + rows[:, None] * stride_ym + column0 + cols[None, :]
                tl.store(
                    out_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=dtype), mask=row_ok[:, None] & (cols < n)[None, :]
                )
        else:
            # The rank-wide intermediate once per row block, then every column tile of this program from it.
            h = tl.zeros((BLOCK_M, RANK_PAD), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < K
                x = tl.load(
                    x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
                )
                # lora_a[lora, :, ks], K contiguous in the tile's last dimension as in memory
                a = tl.load(
                    a_base + ranks[:, None] * stride_ar + ks[None, :], mask=rank_ok[:, None] & k_ok[None, :], other=0.0
                )
                h += tl.dot(x, tl.trans(a))
            hb = (h * scale).to(dtype)
            for t in range(TILES):
                cols = (pid_n * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
                col_ok = cols < n
                # lora_b[lora, cols, :]: (BLOCK_N, RANK_PAD), the rank contiguous as in memory
                b = tl.load(
                    b_base + cols[:, None] * stride_bn + ranks[None, :],
                    mask=col_ok[:, None] & rank_ok[None, :],
                    other=0.0,
                )
                out = tl.dot(hb, tl.trans(b))
                out_ptrs = y_ptr + rows[:, None] * stride_ym + column0 + cols[None, :]
                out_mask = row_ok[:, None] & col_ok[None, :]
                if ADD:
                    out += tl.load(out_ptrs, mask=out_mask, other=0.0).to(tl.float32)
                tl.store(out_ptrs, out.to(dtype), mask=out_mask)


def dense_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    layout: DenseLayout,
    meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int],
    *,
    scale: float = 1.0,
    add: bool = True,
    block_n: int = 64,
    tiles: int = 4,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 3,
) -> None:
    """One launch for all slices. meta: (sorted token indices, tokens per group, group starts, group adapter ids,
    number of groups), as vLLM's `LoRAKernelMeta.meta_args` gives them; `add`: y += LoRA, else y = LoRA (zeros in
    rows without an adapter); each program writes `tiles` column tiles of `block_n`."""
    sorted_ids, counts, starts, ids, groups = meta
    if groups == 0:
        return
    grid = (triton.cdiv(layout.widest, block_n * tiles), layout.slice_n.numel(), groups)
    _dense_lora_kernel[grid](
        x,
        y,
        layout.a_ptrs,
        layout.b_ptrs,
        layout.slice_n,
        layout.columns,
        layout.b_lora_strides,
        sorted_ids,
        counts,
        starts,
        ids,
        x.shape[0],
        layout.k,
        layout.rank,
        scale,
        x.stride(0),
        y.stride(0),
        layout.stride_al,
        layout.stride_ar,
        layout.stride_bn,
        BLOCK_M=16,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        RANK_PAD=max(16, triton.next_power_of_2(layout.rank)),
        TILES=tiles,
        ADD=add,
        num_warps=num_warps,
        num_stages=num_stages,
    )
