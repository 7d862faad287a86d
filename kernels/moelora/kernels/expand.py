"""The fused op's second kernel, (partial sums @ B.T) added into the output rows, and its launcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from .shrink import launch_options
from .tiles import block_span, expand_row, load_b_tile, load_out_tile, store_out_tile

if TYPE_CHECKING:
    from .fused import OpPlan

__all__ = ["launch_expand"]


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _expand_kernel(
    # pointers
    part_ptr,  # (SPLIT_K, P, RANK_PAD) float32 partial sums from _shrink_kernel
    b_ptr,  # (max_loras, E, N, rank) lora_b
    b1_ptr,  # slice 1's lora_b, when NUM_SLICES > 1 (else None)
    out_ptr,  # (P, N) output rows (a (M, top_k, N) view), updated in place
    topk_w_ptr,  # (P,) routed weights, read when MUL_ROUTED_WEIGHT
    sorted_ptr,  # (P,) int32
    table_ptr,  # (3, max_blocks) int32
    num_blocks_ptr,  # (1,) int32
    topk_ptr,  # (P,) expert ids, read when DIRECT
    lora_ptr,  # (M,) adapter slots, read when DIRECT
    ready_ptr,  # (max_blocks,) int32 readiness counters, when READY
    scale_ptr,  # (slices, max_loras, E, rank) float32 int8 weights' scales, when SCALED
    # sizes
    N,
    rank,
    num_experts,
    top_k,
    max_loras,
    num_pairs,
    max_blocks,
    # strides
    stride_bl,
    stride_be,
    stride_bn,
    stride_br,
    stride_om,
    stride_on,
    stride_w,
    # meta
    MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    N_TILES: tl.constexpr,
    RANK_PAD: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_R: tl.constexpr,
    DIRECT: tl.constexpr,
    READY: tl.constexpr,
    USE_PDL: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    SCALED: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    if NUM_SLICES > 1:
        # Grid dim 2 is the slice: its partial sums, its B, and its N columns of the output row.
        slice_id = tl.program_id(2).to(tl.int64)
        if slice_id == 1:
            b_ptr = b1_ptr
        out_ptr += slice_id * N * stride_on
        part_ptr += slice_id * SPLIT_K * num_pairs * RANK_PAD
        if SCALED:
            scale_ptr += slice_id * max_loras * num_experts * rank
    if USE_PDL and READY:
        # The next kernel waits for this whole grid before it reads anything of ours; starting it now lets its
        # CTAs take free SMs and fetch what does not depend on us (the down op's shrink: routing and A).
        tl.extra.cuda.gdc_launch_dependents()
    adapter, expert, start, end, live = block_span(
        table_ptr, num_blocks_ptr, topk_ptr, lora_ptr, pid_b, max_blocks, num_experts, top_k, max_loras, DIRECT
    )
    if not live:
        return
    offs_r = tl.arange(0, RANK_PAD)
    offs_n = pid_n * (BLOCK_N * N_TILES) + tl.arange(0, BLOCK_N)
    b_ptrs = (
        b_ptr + adapter * stride_bl + expert * stride_be + offs_n[None, :] * stride_bn + offs_r[:, None] * stride_br
    )
    bt = load_b_tile(b_ptrs, offs_n, offs_r, N, rank, EVEN_N, EVEN_R)
    # The intermediate is rounded to the output's dtype (the weights' own when they are not int8, as vLLM does).
    svec = tl.zeros((RANK_PAD,), dtype=tl.float32)
    if SCALED:
        svec = tl.load(scale_ptr + (adapter * num_experts + expert) * rank + offs_r, mask=offs_r < rank, other=0.0)
    if USE_PDL and not READY:
        # Everything above depends only on the routing, complete before the shrink let this grid start.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if DIRECT:
        # Vector math on the block's one pair (see the shrink); the next tile's load goes out before this tile's
        # arithmetic, so a CTA always has B in flight.
        for t in tl.static_range(N_TILES):
            if t + 1 < N_TILES:
                bt_next = load_b_tile(
                    b_ptrs + (t + 1) * BLOCK_N * stride_bn, offs_n + (t + 1) * BLOCK_N, offs_r, N, rank, EVEN_N, EVEN_R
                )
            for pos in range(start, end):
                expand_row(
                    bt,
                    pos,
                    part_ptr,
                    out_ptr,
                    topk_w_ptr,
                    offs_n + t * BLOCK_N,
                    offs_r,
                    N,
                    num_pairs,
                    stride_om,
                    stride_on,
                    stride_w,
                    MUL_ROUTED_WEIGHT,
                    RANK_PAD,
                    SPLIT_K,
                    svec,
                    SCALED,
                )
            if t + 1 < N_TILES:
                bt = bt_next
    else:
        offs_m = start + tl.arange(0, BLOCK_M)
        mask_m = offs_m < end
        pair = tl.load(sorted_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        out_ptrs = out_ptr + pair[:, None] * stride_om + offs_n[None, :] * stride_on
        # The output tile's load goes out before the partial sums' so the two round trips overlap.
        old = load_out_tile(out_ptrs, offs_n, mask_m, N, EVEN_N)
        part_ptrs = part_ptr + offs_m[:, None] * RANK_PAD + offs_r[None, :]
        if READY:
            # Wait for this block's SPLIT_K shrink CTAs only, not the whole shrink grid. No deadlock: PDL starts
            # this grid only once every shrink CTA is running. The output (older kernels' work) is complete: the
            # shrink passed its own wait before it let this grid start. The partial sums bypass L1 (.cg).
            # Every slice's shrink counts into the block's one counter.
            while tl.atomic_add(ready_ptr + pid_b, 0, sem="acquire", scope="gpu") < SPLIT_K * NUM_SLICES:
                pass
        inter = tl.load(part_ptrs, mask=mask_m[:, None], other=0.0, cache_modifier=".cg" if READY else "")
        for s in tl.static_range(1, SPLIT_K):
            inter += tl.load(
                part_ptrs + s * num_pairs * RANK_PAD,
                mask=mask_m[:, None],
                other=0.0,
                cache_modifier=".cg" if READY else "",
            )
        if SCALED:
            inter = (inter * svec[None, :]).to(out_ptr.dtype.element_ty)
        else:
            inter = inter.to(bt.dtype)
        w = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if MUL_ROUTED_WEIGHT:
            w = tl.load(topk_w_ptr + pair * stride_w, mask=mask_m, other=0.0).to(tl.float32)
        store_out_tile(
            out_ptrs, old, tl.dot(inter, bt.to(inter.dtype)), w, offs_n, mask_m, N, MUL_ROUTED_WEIGHT, EVEN_N
        )
        # A loop, not unrolled: with num_stages > 1 Triton pipelines its B loads (cp.async into shared memory).
        for t in range(1, N_TILES):
            offs_t = offs_n + t * BLOCK_N
            bt = load_b_tile(b_ptrs + t * BLOCK_N * stride_bn, offs_t, offs_r, N, rank, EVEN_N, EVEN_R)
            old = load_out_tile(out_ptrs + t * BLOCK_N * stride_on, offs_t, mask_m, N, EVEN_N)
            store_out_tile(
                out_ptrs + t * BLOCK_N * stride_on,
                old,
                tl.dot(inter, bt.to(inter.dtype)),
                w,
                offs_t,
                mask_m,
                N,
                MUL_ROUTED_WEIGHT,
                EVEN_N,
            )


def launch_expand(p: OpPlan, partials: torch.Tensor) -> None:
    """Launch the expand of a planned op on the shrink's partial sums (launch_shrink's result)."""
    r, cfg = p.routing, p.cfg
    n_tiles = max(1, cfg.expand_tiles)
    span = cfg.expand_block_n * n_tiles
    grid = (r.max_blocks, triton.cdiv(p.n, span)) + ((p.slices,) if p.slices > 1 else ())
    _expand_kernel[grid](
        partials,
        p.lora_b,
        p.lora_b1,
        p.output,
        p.weights if p.weights is not None else partials,
        r.sorted_pairs,
        r.block_table,
        r.num_blocks,
        r.topk_ids,
        r.token_lora,
        p.ready if p.ready is not None else r.num_blocks,
        p.scale if p.scale is not None else partials,
        p.n,
        p.rank,
        r.num_experts,
        r.top_k,
        r.max_loras,
        r.num_pairs,
        r.max_blocks,
        *p.lora_b.stride(),
        p.output.stride(1),
        p.output.stride(2),
        p.weights.stride(1) if p.weights is not None else 0,
        MUL_ROUTED_WEIGHT=p.mul_routed_weight,
        BLOCK_M=r.block_m,
        BLOCK_N=cfg.expand_block_n,
        N_TILES=n_tiles,
        RANK_PAD=p.rank_pad,
        SPLIT_K=p.split_k,
        EVEN_N=p.n % span == 0,
        EVEN_R=p.rank == p.rank_pad,
        DIRECT=r.direct,
        READY=p.ready is not None,
        USE_PDL=p.pdl,
        NUM_SLICES=p.slices,
        SCALED=p.scale is not None,
        num_warps=cfg.expand_warps,
        num_stages=cfg.expand_stages,
        **launch_options(p.pdl, cfg.expand_maxnreg),
    )
