"""Triton helpers inlined into the fused op's shrink and expand kernels: reading a block of the routing, and
loading or storing one tile with only the masks its shape needs."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["block_span", "expand_row", "load_a_tile", "load_b_tile", "load_out_tile", "load_x_tile", "store_out_tile"]


@triton.jit
def block_span(
    table_ptr,
    num_blocks_ptr,
    topk_ptr,
    lora_ptr,
    pid_b,
    max_blocks,
    num_experts,
    top_k,
    max_loras,
    DIRECT: tl.constexpr,
):
    """Block pid_b of the routing, shared by the shrink and the expand so both read it the same way: its adapter
    and expert, its rows [start, end) (positions in sorted_pairs and in the partial sums), and whether the block
    exists at all (read nothing else of a block that does not). Grouped routing: row pid_b of the block table
    (3, max_blocks). Direct: pair pid_b alone, live when its token has an adapter and its expert is on this rank."""
    if DIRECT:
        expert = tl.load(topk_ptr + pid_b).to(tl.int32)
        adapter = tl.load(lora_ptr + pid_b // top_k).to(tl.int32)
        live = (expert >= 0) & (expert < num_experts) & (adapter >= 0) & (adapter < max_loras)
        return adapter.to(tl.int64), expert.to(tl.int64), pid_b, pid_b + 1, live
    else:
        live = pid_b < tl.load(num_blocks_ptr)
        group = tl.load(table_ptr + pid_b)
        start = tl.load(table_ptr + max_blocks + pid_b)
        end = tl.load(table_ptr + 2 * max_blocks + pid_b)
        return (group // num_experts).to(tl.int64), (group % num_experts).to(tl.int64), start, end, live


@triton.jit
def load_a_tile(a_ptrs, k0, offs_k, offs_r, K, rank, EVEN_K: tl.constexpr, EVEN_R: tl.constexpr):
    """The (BLOCK_K, RANK_PAD) tile of A at K offset k0, zero past K and past the rank."""
    if EVEN_K:
        if EVEN_R:
            at = tl.load(a_ptrs)
        else:
            at = tl.load(a_ptrs, mask=(offs_r < rank)[None, :], other=0.0)
    else:
        at = tl.load(a_ptrs, mask=(k0 + offs_k < K)[:, None] & (offs_r < rank)[None, :], other=0.0)
    return at


@triton.jit
def load_x_tile(x_ptrs, k0, offs_k, mask_m, K, EVEN_K: tl.constexpr):
    """The (BLOCK_M, BLOCK_K) tile of a grouped block's input rows at K offset k0, zero in rows past the block's
    end and past K."""
    if EVEN_K:
        xt = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
    else:
        xt = tl.load(x_ptrs, mask=mask_m[:, None] & (k0 + offs_k < K)[None, :], other=0.0)
    return xt


@triton.jit
def load_b_tile(b_ptrs, offs_n, offs_r, N, rank, EVEN_N: tl.constexpr, EVEN_R: tl.constexpr):
    """The (RANK_PAD, BLOCK_N) tile of B at columns offs_n, zero past N and past the rank.

    Each mask only where needed: a rank mask (a runtime bound along the contiguous rank axis) stops the compiler
    from vectorising the loads, down to one 2-byte load per element."""
    if EVEN_N and EVEN_R:
        bt = tl.load(b_ptrs)
    elif EVEN_R:
        bt = tl.load(b_ptrs, mask=(offs_n < N)[None, :], other=0.0)
    elif EVEN_N:
        bt = tl.load(b_ptrs, mask=(offs_r < rank)[:, None], other=0.0)
    else:
        bt = tl.load(b_ptrs, mask=(offs_n < N)[None, :] & (offs_r < rank)[:, None], other=0.0)
    return bt


@triton.jit
def expand_row(
    bt,
    pos,
    part_ptr,
    out_ptr,
    topk_w_ptr,
    offs_n,
    offs_r,
    N,
    num_pairs,
    stride_om,
    stride_on,
    stride_w,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    RANK_PAD: tl.constexpr,
    SPLIT_K: tl.constexpr,
    svec,
    SCALED: tl.constexpr,
):
    """Direct pair pos through the (RANK_PAD, BLOCK_N) tile bt: sum its SPLIT_K partials, multiply, scale, and add
    into its output row; a broadcast multiply and a sum over the rank, not a tl.dot. SCALED: bt is int8 and svec
    the rank's scales, applied before the intermediate is rounded to the output's dtype."""
    pair = tl.cast(pos, tl.int64)
    out_ptrs = out_ptr + pair * stride_om + offs_n * stride_on
    old = tl.load(out_ptrs, mask=offs_n < N, other=0.0)
    part_ptrs = part_ptr + pos * RANK_PAD + offs_r
    inter = tl.load(part_ptrs)
    for s in tl.static_range(1, SPLIT_K):
        inter += tl.load(part_ptrs + s * num_pairs * RANK_PAD)
    if SCALED:
        inter = (inter * svec).to(old.dtype).to(tl.float32)
    else:
        inter = inter.to(bt.dtype).to(tl.float32)  # rounded like the tile path's (and vLLM's) intermediate
    acc = tl.sum(inter[:, None] * bt.to(tl.float32), axis=0)
    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + pair * stride_w).to(tl.float32)
    tl.store(out_ptrs, (old.to(tl.float32) + acc).to(old.dtype), mask=offs_n < N)


@triton.jit
def load_out_tile(out_ptrs, offs_n, mask_m, N, EVEN_N: tl.constexpr):
    if EVEN_N:
        old = tl.load(out_ptrs, mask=mask_m[:, None], other=0.0)
    else:
        old = tl.load(out_ptrs, mask=mask_m[:, None] & (offs_n < N)[None, :], other=0.0)
    return old


@triton.jit
def store_out_tile(out_ptrs, old, acc, w, offs_n, mask_m, N, MUL_ROUTED_WEIGHT: tl.constexpr, EVEN_N: tl.constexpr):
    """old + acc (scaled by the rows' routed weights) back into the output rows, in their dtype."""
    if MUL_ROUTED_WEIGHT:
        acc = acc * w[:, None]
    if EVEN_N:
        tl.store(out_ptrs, (old.to(tl.float32) + acc).to(old.dtype), mask=mask_m[:, None])
    else:
        tl.store(out_ptrs, (old.to(tl.float32) + acc).to(old.dtype), mask=mask_m[:, None] & (offs_n < N)[None, :])
