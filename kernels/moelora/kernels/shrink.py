"""The fused op's first kernel, x_rows @ A.T per routed pair, and its launcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from .tiles import block_span, load_a_tile, load_x_tile

if TYPE_CHECKING:
    from .fused import OpPlan

__all__ = ["early_a_fits", "launch_shrink"]


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _shrink_kernel(
    # pointers
    x_ptr,  # (M, K) or (P, K): the op's input rows
    a_ptr,  # (max_loras, E, rank, K) lora_a
    a1_ptr,  # slice 1's lora_a, when NUM_SLICES > 1 (else None)
    part_ptr,  # (SPLIT_K, P, RANK_PAD) float32 partial sums, row = position in sorted_pairs
    sorted_ptr,  # (P,) int32 pair ids grouped by (adapter, expert)
    table_ptr,  # (3, max_blocks) int32 block table: group, start, end
    num_blocks_ptr,  # (1,) int32
    topk_ptr,  # (P,) expert ids, read when DIRECT
    lora_ptr,  # (M,) adapter slots, read when DIRECT
    ready_ptr,  # (max_blocks,) int32 readiness counters, zero on entry, when READY
    # sizes
    K,
    rank,
    num_experts,
    top_k,
    max_loras,
    num_pairs,
    max_blocks,
    # strides
    stride_xm,
    stride_xk,
    stride_al,
    stride_ae,
    stride_ar,
    stride_ak,
    # meta
    X_PER_PAIR: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RANK_PAD: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_R: tl.constexpr,
    DIRECT: tl.constexpr,
    READY: tl.constexpr,
    USE_PDL: tl.constexpr,
    A_BEFORE_WAIT: tl.constexpr,
    NUM_SLICES: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    if NUM_SLICES > 1:
        # Grid dim 2 is the slice (Qwen3's gate and up): its own A and its own partial sums, the routing shared.
        slice_id = tl.program_id(2).to(tl.int64)
        if slice_id == 1:
            a_ptr = a1_ptr
        part_ptr += slice_id * SPLIT_K * num_pairs * RANK_PAD
    if USE_PDL and not A_BEFORE_WAIT:
        # Wait for the routing (and whatever wrote x), then let the expand's CTAs start: they only read the
        # routing's tables and B before their own wait.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    adapter, expert, start, end, live = block_span(
        table_ptr, num_blocks_ptr, topk_ptr, lora_ptr, pid_b, max_blocks, num_experts, top_k, max_loras, DIRECT
    )
    if not live:
        return
    offs_r = tl.arange(0, RANK_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    k_iters = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_iters, SPLIT_K)
    it_lo = pid_s * per_split
    it_hi = tl.minimum(it_lo + per_split, k_iters)
    a_block = a_ptr + adapter * stride_al + expert * stride_ae + it_lo * BLOCK_K * stride_ak
    a_offs = offs_r[None, :] * stride_ar + offs_k[:, None] * stride_ak
    part = part_ptr + pid_s * num_pairs * RANK_PAD
    if DIRECT:
        # The block's one pair (position = pair id): a broadcast multiply and a sum over K rather than a
        # BLOCK_M-row tl.dot with the other rows masked off; the registers those rows held go to more CTAs per SM
        # and more loads in flight.
        for pos in range(start, end):
            pair = tl.cast(pos, tl.int64)
            if X_PER_PAIR:
                row = pair
            else:
                row = pair // top_k
            x_ptrs = x_ptr + row * stride_xm + (it_lo * BLOCK_K + offs_k) * stride_xk
            a_ptrs = a_block + a_offs
            acc = tl.zeros((RANK_PAD,), dtype=tl.float32)
            for it in range(it_lo, it_hi):
                at = load_a_tile(a_ptrs, it * BLOCK_K, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
                if EVEN_K:
                    xt = tl.load(x_ptrs)
                else:
                    xt = tl.load(x_ptrs, mask=it * BLOCK_K + offs_k < K, other=0.0)
                acc += tl.sum(at.to(tl.float32) * xt.to(tl.float32)[:, None], axis=0)
                x_ptrs += BLOCK_K * stride_xk
                a_ptrs += BLOCK_K * stride_ak
            tl.store(part + pos * RANK_PAD + offs_r, acc)
    else:
        offs_m = start + tl.arange(0, BLOCK_M)
        mask_m = offs_m < end
        a_ptrs = a_block + a_offs
        pair = tl.load(sorted_ptr + offs_m, mask=mask_m, other=0)
        if X_PER_PAIR:
            row = pair.to(tl.int64)
        else:
            row = (pair // top_k).to(tl.int64)
        x_ptrs = x_ptr + row[:, None] * stride_xm + (it_lo * BLOCK_K + offs_k)[None, :] * stride_xk
        acc = tl.zeros((BLOCK_M, RANK_PAD), dtype=tl.float32)
        it_first = it_lo
        if A_BEFORE_WAIT:
            # The routing is complete (an earlier op on it waited for it) and A is the adapter's weights: the first
            # A tile is in flight while this CTA waits for whatever wrote x.
            at = load_a_tile(a_ptrs, it_lo * BLOCK_K, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
            if USE_PDL:
                tl.extra.cuda.gdc_wait()
                tl.extra.cuda.gdc_launch_dependents()
            xt = load_x_tile(x_ptrs, it_lo * BLOCK_K, offs_k, mask_m, K, EVEN_K)
            acc += tl.dot(xt, at.to(xt.dtype))
            x_ptrs += BLOCK_K * stride_xk
            a_ptrs += BLOCK_K * stride_ak
            it_first = it_lo + 1
        for it in range(it_first, it_hi):
            # A first: its address does not wait on the sorted-pairs load that x's does.
            at = load_a_tile(a_ptrs, it * BLOCK_K, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
            xt = load_x_tile(x_ptrs, it * BLOCK_K, offs_k, mask_m, K, EVEN_K)
            acc += tl.dot(xt, at.to(xt.dtype))
            x_ptrs += BLOCK_K * stride_xk
            a_ptrs += BLOCK_K * stride_ak
        tl.store(part + offs_m[:, None] * RANK_PAD + offs_r[None, :], acc, mask=mask_m[:, None])
        if READY:
            # Every thread's stores are done (the barrier) before one release-add counts this split (of this slice)
            # as ready.
            tl.debug_barrier()
            tl.atomic_add(ready_ptr + pid_b, 1, sem="release", scope="gpu")


def early_a_fits(block_k: int, rank_pad: int, warps: int) -> bool:
    """Whether a shrink may hold its first A tile across its wait: at most 64 elements a thread. The tile roughly
    doubles the kernel's registers, and past 64 elements a thread the kernel spills (kernels/scripts/sm90_ptx.py
    shows the register counts)."""
    return block_k * rank_pad <= 64 * 32 * warps


def launch_shrink(p: OpPlan) -> torch.Tensor:
    """Launch the shrink of a planned op (fused.plan_op checked the shapes); returns its partial sums,
    (slices, split_k, P, rank_pad) float32, for the expand."""
    r, cfg = p.routing, p.cfg
    partials = torch.empty((p.slices, p.split_k, r.num_pairs, p.rank_pad), dtype=torch.float32, device=p.x_rows.device)
    grid = (r.max_blocks, p.split_k) if p.slices == 1 else (r.max_blocks, p.split_k, p.slices)
    _shrink_kernel[grid](
        p.x_rows,
        p.lora_a,
        p.lora_a1,
        partials,
        r.sorted_pairs,
        r.block_table,
        r.num_blocks,
        r.topk_ids,
        r.token_lora,
        p.ready if p.ready is not None else r.num_blocks,
        p.k,
        p.rank,
        r.num_experts,
        r.top_k,
        r.max_loras,
        r.num_pairs,
        r.max_blocks,
        p.x_rows.stride(0),
        p.x_rows.stride(1),
        *p.lora_a.stride(),
        X_PER_PAIR=p.per_pair,
        BLOCK_M=r.block_m,
        BLOCK_K=cfg.shrink_block_k,
        RANK_PAD=p.rank_pad,
        SPLIT_K=p.split_k,
        EVEN_K=p.k % cfg.shrink_block_k == 0,
        EVEN_R=p.rank == p.rank_pad,
        DIRECT=r.direct,
        READY=p.ready is not None,
        USE_PDL=p.pdl,
        A_BEFORE_WAIT=p.routing_settled
        and not r.direct
        and early_a_fits(cfg.shrink_block_k, p.rank_pad, cfg.shrink_warps),
        NUM_SLICES=p.slices,
        num_warps=cfg.shrink_warps,
        num_stages=cfg.shrink_stages,
        **launch_options(p.pdl, cfg.shrink_maxnreg),
    )
    return partials


def launch_options(pdl: bool, maxnreg: int | None) -> dict:
    """Triton launch keywords: programmatic dependent launch, and a register cap when the config sets one."""
    return ({"launch_pdl": True} if pdl else {}) | ({"maxnreg": maxnreg} if maxnreg is not None else {})
