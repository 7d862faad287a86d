"""The fused op in one launch at decode sizes: shrink and expand in the same kernel, split over enough CTAs to fill
the GPU, with the rank intermediate passed between a pair's CTAs through a small float32 buffer.

Grid (P, S, slices): CTA (p, s) of direct routing's pair p reduces the s-th K range of x_row @ A.T into a partial
sum of the rank, stores it and counts it on the pair's counter; once the counter shows all S partials it sums them
and applies the s-th N range of B, adding into the output row. Every CTA fetches its B tile (weights only) before
it waits, so the wait costs the exchange of the partials, not a B round trip. The two-kernel direct path pays a
second kernel per op instead (docs/benchmarks.md has the costs).

The wait spins on CTAs of the same grid, so every CTA must be resident at once: the launcher sizes S from the
compiled kernel's occupancy and launches nothing (the caller then runs the two-kernel path) when even S = 1 does
not fit. A kernel launched after this one cannot take the room first: with programmatic dependent launch it starts only
once every CTA of this grid has started.

Each (pair, slice) has two words: an arrival count, which only grows (each CTA adds one once its partial is
stored), and the count at which the current op starts (its base). A CTA waits until the count is S past the base;
CTA 0 of the row moves the base on by S at its end, with a plain store, not an atomic round trip (the next op
reads it only once this grid has finished). They live in one buffer per device, zeroed once, which consecutive ops
share: each waits for the previous kernel before it touches them. Two ops must not run at the same time on one
device (on two streams): vLLM runs a model's MoE layers one after another on one stream.

TRITON_INTERPRET runs a grid's programs one after another, where a spinning CTA would wait forever for a sibling
that runs after it: there the launcher runs the same code in three launches, split at the wait and before the base
moves: PHASE 1 (the shrinks), PHASE 2 (the expands), PHASE 3 (the base).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from .residency import SPLIT_PAD, counter_buffer, onepass_split, resident_room, sm_count
from .shrink import launch_options
from .tiles import load_a_tile

if TYPE_CHECKING:
    from .fused import OpPlan

__all__ = ["SPLIT_PAD", "launch_onepass", "onepass_split"]


@triton.jit(do_not_specialize=["num_pairs", "n_split", "k_tiles", "n_tiles"])
def _onepass_kernel(
    # pointers
    x_ptr,  # (M, K) or (P, K): the op's input rows
    a_ptr,  # (max_loras, E, rank, K) lora_a
    a1_ptr,  # slice 1's lora_a, when NUM_SLICES > 1 (else None)
    b_ptr,  # (max_loras, E, N, rank) lora_b
    b1_ptr,  # slice 1's lora_b, when NUM_SLICES > 1 (else None)
    out_ptr,  # (P, N) output rows (a (M, top_k, slices * N) view), updated in place
    topk_w_ptr,  # (P,) routed weights, read when MUL_ROUTED_WEIGHT
    topk_ptr,  # (P,) expert ids
    lora_ptr,  # (M,) adapter slots
    part_ptr,  # (NUM_SLICES, P, SPLIT_PAD, RANK_PAD) float32 partial sums
    count_ptr,  # (>= 2 * NUM_SLICES * P,) int32: arrival count, base of each (pair, slice)
    # sizes
    K,
    N,
    rank,
    num_experts,
    top_k,
    max_loras,
    num_pairs,
    n_split,  # S, CTAs per (pair, slice)
    k_tiles,  # K tiles (BLOCK_K columns) per CTA
    n_tiles,  # N tiles (BLOCK_N columns) per CTA
    # strides
    stride_xm,
    stride_xk,
    stride_al,
    stride_ae,
    stride_ar,
    stride_ak,
    stride_bl,
    stride_be,
    stride_bn,
    stride_br,
    stride_om,
    stride_on,
    stride_w,
    # meta
    X_PER_PAIR: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RANK_PAD: tl.constexpr,
    SPLIT_PAD: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_R: tl.constexpr,
    ROUTING_SETTLED: tl.constexpr,
    USE_PDL: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    PHASE: tl.constexpr,  # 0: the whole op; 1: shrinks, 2: expands, 3: the base moves on (the interpreter)
):
    pair = tl.program_id(0)
    split = tl.program_id(1)
    slice_id = 0
    if NUM_SLICES > 1:
        slice_id = tl.program_id(2)
        if slice_id == 1:
            a_ptr = a1_ptr
            b_ptr = b1_ptr
        out_ptr += slice_id.to(tl.int64) * N * stride_on
    if USE_PDL:
        if not ROUTING_SETTLED:
            # The routing may come from the kernel before this one.
            tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    expert = tl.load(topk_ptr + pair).to(tl.int32)
    adapter = tl.load(lora_ptr + pair // top_k).to(tl.int32)
    if (expert < 0) | (expert >= num_experts) | (adapter < 0) | (adapter >= max_loras):
        return  # the whole (pair, slice) row of CTAs leaves: nobody waits for it
    pair64 = tl.cast(pair, tl.int64)
    offs_r = tl.arange(0, RANK_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = tl.arange(0, BLOCK_N)
    # Spans start on whole tiles, so the compiler knows their alignment and vectorises the loads.
    k_lo = split * k_tiles * BLOCK_K
    k_hi = tl.minimum(k_lo + k_tiles * BLOCK_K, K)
    n_lo = split * n_tiles * BLOCK_N
    n_hi = tl.minimum(n_lo + n_tiles * BLOCK_N, N)
    counter = count_ptr + 2 * (slice_id * num_pairs + pair)  # arrivals; counter + 1: the base
    part_row = part_ptr + ((slice_id * num_pairs + pair).to(tl.int64) * SPLIT_PAD) * RANK_PAD

    # B's first tile: weights only, in flight from here on, through the shrink and the wait.
    b_ptrs = (
        b_ptr
        + adapter.to(tl.int64) * stride_bl
        + expert.to(tl.int64) * stride_be
        + (n_lo + offs_n)[None, :] * stride_bn
        + offs_r[:, None] * stride_br
    )
    b_mask = (n_lo + offs_n < n_hi)[None, :]
    if not EVEN_R:
        b_mask = b_mask & (offs_r < rank)[:, None]
    if (PHASE == 0) | (PHASE == 2):
        bt = tl.load(b_ptrs, mask=b_mask, other=0.0)

    if (PHASE == 0) | (PHASE == 1):
        if X_PER_PAIR:
            row = pair64
        else:
            row = pair64 // top_k
        a_ptrs = (
            a_ptr
            + adapter.to(tl.int64) * stride_al
            + expert.to(tl.int64) * stride_ae
            + offs_r[None, :] * stride_ar
            + (k_lo + offs_k)[:, None] * stride_ak
        )
        x_ptrs = x_ptr + row * stride_xm + (k_lo + offs_k) * stride_xk
        # Every CTA has at least one K tile (the launcher's S); the first is fetched before the wait when the
        # routing is settled (A is weights).
        at = load_a_tile(a_ptrs, k_lo, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
        if USE_PDL and ROUTING_SETTLED:
            tl.extra.cuda.gdc_wait()  # x and the output come from earlier kernels
        xt = _load_x(x_ptrs, k_lo, offs_k, K, EVEN_K)
        base = tl.load(counter + 1, cache_modifier=".cg")  # moved on by the previous op, which has finished
        # A (BLOCK_K, RANK_PAD) accumulator, reduced over K once at the end, not once per tile. The next tile's
        # loads go out before this tile's arithmetic, so two tiles are in flight (Triton does not pipeline this loop).
        acc2 = tl.zeros((BLOCK_K, RANK_PAD), dtype=tl.float32)
        for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            a_ptrs += BLOCK_K * stride_ak
            x_ptrs += BLOCK_K * stride_xk
            at_next = load_a_tile(a_ptrs, k0, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
            xt_next = _load_x(x_ptrs, k0, offs_k, K, EVEN_K)
            acc2 += at.to(tl.float32) * xt.to(tl.float32)[:, None]
            at, xt = at_next, xt_next
        acc2 += at.to(tl.float32) * xt.to(tl.float32)[:, None]
        acc = tl.sum(acc2, axis=0)
        if (n_split > 1) | (PHASE != 0):
            tl.store(part_row + split * RANK_PAD + offs_r, acc)
            # Every thread's store is done (the barrier) before one release-add counts this partial.
            tl.debug_barrier()
            tl.atomic_add(counter, 1, sem="release", scope="gpu")

    if (PHASE == 0) | (PHASE == 2):
        # The output's first tile (written by earlier kernels: the wait is behind us) and B's second go out before
        # this CTA waits for its siblings.
        out_ptrs = out_ptr + pair64 * stride_om + (n_lo + offs_n) * stride_on
        old = _load_out(out_ptrs, n_lo, offs_n, n_hi, EVEN_N)
        nxt = tl.load(b_ptrs + BLOCK_N * stride_bn, mask=b_mask & (n_lo + BLOCK_N + offs_n < n_hi)[None, :], other=0.0)
        offs_s = tl.arange(0, SPLIT_PAD)
        if PHASE == 2:
            base = tl.load(counter + 1)
        if (n_split > 1) | (PHASE != 0):
            # The difference, not the count: it is right across the count's wrap-around.
            while tl.atomic_add(counter, 0, sem="acquire", scope="gpu") - base < n_split:
                pass
            parts = tl.load(
                part_row + offs_s[:, None] * RANK_PAD + offs_r[None, :],
                mask=(offs_s < n_split)[:, None],
                other=0.0,
                cache_modifier=".cg",
            )
            inter = tl.sum(parts, axis=0)
        else:
            inter = acc
        # Rounded to the weights' dtype, as the two-kernel path (and vLLM) round the rank intermediate.
        inter = inter.to(bt.dtype).to(tl.float32)
        w = 1.0
        if MUL_ROUTED_WEIGHT:
            w = tl.load(topk_w_ptr + pair64 * stride_w).to(tl.float32)
        if n_lo < n_hi:
            _add_tile(out_ptrs, old, bt, inter, w, n_lo, offs_n, n_hi, MUL_ROUTED_WEIGHT, EVEN_N)
        # Later tiles (decode sizes have none, or a few), each tile's loads issued a tile ahead.
        for n0 in range(n_lo + BLOCK_N, n_hi, BLOCK_N):
            b_ptrs += BLOCK_N * stride_bn
            out_ptrs += BLOCK_N * stride_on
            bt = nxt
            old = _load_out(out_ptrs, n0, offs_n, n_hi, EVEN_N)
            nxt = tl.load(
                b_ptrs + BLOCK_N * stride_bn, mask=b_mask & (n0 + BLOCK_N + offs_n < n_hi)[None, :], other=0.0
            )
            _add_tile(out_ptrs, old, bt, inter, w, n0, offs_n, n_hi, MUL_ROUTED_WEIGHT, EVEN_N)
    if PHASE == 3:
        base = tl.load(counter + 1)
    if (PHASE == 0) | (PHASE == 3):
        if (split == 0) & ((n_split > 1) | (PHASE != 0)):
            # All S have arrived (this CTA saw them); siblings still spinning keep the base they read.
            tl.store(counter + 1, base + n_split)


@triton.jit
def _load_out(out_ptrs, n0, offs_n, n_hi, EVEN_N: tl.constexpr):
    """The output tile at column n0, nothing when n0 is past the CTA's span. With EVEN_N the span is whole tiles, so
    one flag for the whole tile does, and the loads stay vectorised."""
    if EVEN_N:
        old = tl.load(out_ptrs, mask=tl.zeros_like(offs_n) + n0 < n_hi, other=0.0)  # uniform over the tile
    else:
        old = tl.load(out_ptrs, mask=n0 + offs_n < n_hi, other=0.0)
    return old


@triton.jit
def _add_tile(out_ptrs, old, bt, inter, w, n0, offs_n, n_hi, MUL_ROUTED_WEIGHT: tl.constexpr, EVEN_N: tl.constexpr):
    """old + w * sum_r inter[r] * bt[r, n] into the output over one (RANK_PAD, BLOCK_N) tile of B; a broadcast
    multiply and a sum over the rank, not a tl.dot (one row)."""
    delta = tl.sum(inter[:, None] * bt.to(tl.float32), axis=0)
    if MUL_ROUTED_WEIGHT:
        delta = delta * w
    new = (old.to(tl.float32) + delta).to(old.dtype)
    if EVEN_N:
        tl.store(out_ptrs, new)
    else:
        tl.store(out_ptrs, new, mask=n0 + offs_n < n_hi)


@triton.jit
def _load_x(x_ptrs, k0, offs_k, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        xt = tl.load(x_ptrs)
    else:
        xt = tl.load(x_ptrs, mask=k0 + offs_k < K, other=0.0)
    return xt


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def launch_onepass(p: OpPlan) -> bool:
    """Run a planned op (direct routing) as one kernel; False, launching nothing, when its CTAs cannot all be
    resident at once (the caller runs the two-kernel path)."""
    r, cfg = p.routing, p.cfg
    dev = p.x_rows.device
    block_k, block_n = cfg.one_pass_block_k, cfg.one_pass_block_n
    units = r.num_pairs * p.slices
    interpreted = _interpreted()
    pdl = p.pdl and not interpreted
    consts = {
        "X_PER_PAIR": p.per_pair,
        "MUL_ROUTED_WEIGHT": p.mul_routed_weight,
        "BLOCK_K": block_k,
        "BLOCK_N": block_n,
        "RANK_PAD": p.rank_pad,
        "SPLIT_PAD": SPLIT_PAD,
        "EVEN_K": p.k % block_k == 0,
        "EVEN_N": p.n % block_n == 0,
        "EVEN_R": p.rank == p.rank_pad,
        "ROUTING_SETTLED": p.routing_settled,
        "USE_PDL": pdl,
        "NUM_SLICES": p.slices,
        "num_warps": cfg.one_pass_warps,
        "num_stages": cfg.one_pass_stages,
        **launch_options(pdl, None),
    }
    partials = torch.empty((p.slices, r.num_pairs, SPLIT_PAD, p.rank_pad), dtype=torch.float32, device=dev)

    def args(split: int, k_tiles: int, n_tiles: int, counters: torch.Tensor) -> tuple:
        return (
            p.x_rows,
            p.lora_a,
            p.lora_a1,
            p.lora_b,
            p.lora_b1,
            p.output,
            p.weights if p.weights is not None else partials,
            r.topk_ids,
            r.token_lora,
            partials,
            counters,
            p.k,
            p.n,
            p.rank,
            r.num_experts,
            r.top_k,
            r.max_loras,
            r.num_pairs,
            split,
            k_tiles,
            n_tiles,
            p.x_rows.stride(0),
            p.x_rows.stride(1),
            *p.lora_a.stride(),
            *p.lora_b.stride(),
            p.output.stride(1),
            p.output.stride(2),
            p.weights.stride(1) if p.weights is not None else 0,
        )

    max_split = cfg.one_pass_max_split or SPLIT_PAD
    if interpreted:
        split, k_tiles, n_tiles = onepass_split(
            units=units, room=units * max_split, k=p.k, n=p.n, block_k=block_k, block_n=block_n
        )
        counters = counter_buffer(dev, 2 * units)
        for phase in (1, 2, 3):
            _onepass_kernel[(r.num_pairs, split, p.slices)](
                *args(split, k_tiles, n_tiles, counters), PHASE=phase, **consts
            )
        return True
    counters = counter_buffer(dev, 2 * sm_count(dev) * 32)  # 32: the most resident CTAs an SM holds
    if counters is None:
        return False
    resident = _resident_ctas(dev, args(1, 1, 1, counters), consts)
    room = min(resident, sm_count(dev) * max(1, cfg.one_pass_ctas_per_sm), units * max_split)
    split, k_tiles, n_tiles = onepass_split(units=units, room=room, k=p.k, n=p.n, block_k=block_k, block_n=block_n)
    if split == 0:
        return False
    _onepass_kernel[(r.num_pairs, split, p.slices)](*args(split, k_tiles, n_tiles, counters), PHASE=0, **consts)
    return True


_resident: dict[tuple, int] = {}


def _resident_ctas(device: torch.device, args: tuple, consts: dict) -> int:
    """How many CTAs of this kernel variant the GPU holds at once, from the compiled kernel's registers and shared
    memory. The variant is compiled (not launched) once per key: the constexprs and what Triton specialises the
    other arguments on (dtypes, 16-byte alignment of pointers, integers equal to 1 or divisible by 16)."""

    def spec(v: object) -> object:
        if isinstance(v, torch.Tensor):
            return (v.dtype, v.data_ptr() % 16 == 0)
        if isinstance(v, int) and not isinstance(v, bool):
            return (v == 1, v % 16 == 0)
        return v

    key = (device, tuple(sorted(consts.items())), tuple(spec(v) for v in args))
    if key not in _resident:
        kernel = _onepass_kernel.warmup(*args, grid=(1, 1, 1), PHASE=0, **consts)
        kernel._init_handles()
        _resident[key] = resident_room(device.index or 0, kernel.n_regs, kernel.metadata.shared, consts["num_warps"])
    return _resident[key]
