"""A dense layer's LoRA in one launch with a split-K shrink, y[t, slice] (+)= scale * (x[t] @ A[l].T) @ B[l].T: what
the vLLM plugin serves for vLLM's `add_lora_linear` at 2 <= M <= 64 tokens (`served_config`), in place of vLLM's
buffer, `lora_shrink` and `lora_expand`.

A unit is one slice of one row block (16 rows of an adapter group, vLLM's grouping, `LoRAKernelMeta.meta_args`). The
grid is one dimension, producers first: program p < S * units is split p % S of a unit's shrink; it reduces its K
range of x @ A.T into a float32 partial of its own (no atomics on data, so no buffer to zero) and counts it on the
unit's arrival word (a release add). Each program from S * units on owns a run of a unit's column tiles: it fetches
its first B tile, spins on the arrival word (acquire) until all S partials are there, sums them, rounds to the
weights' dtype (as vLLM's expand reads its float32 buffer) and writes or adds the output. Rows without an adapter
(group id -1) get zeros when writing (`add=False`), with no shrink and no wait, and so do rows in no group at all (a
batch padded past the tokens grouped): writing, every row of the output is written.

Deadlock: an expand program spins on shrink programs of the same grid. The launcher only launches grids the GPU holds
whole at once (occupancy of the compiled kernel), so every producer runs whatever the block scheduler's order; the
producers-first ids make the usual in-order dispatch start them first as well. A kernel of another stream (vLLM's
base GEMM beside the LoRA stream) can delay programs but never waits on them, so they all start in the end.
TRITON_INTERPRET runs programs one after another in id order, so there every producer has finished before the first
consumer looks.

Counters: each unit has two int32 words, arrivals and departures, zero at rest. Every expand program of a unit adds
one departure after its wait; the last to depart zeroes both words (all S have arrived, every sibling has stopped
spinning), so the next op, on the same stream, starts from zero: a CUDA graph replays with no reset node. One buffer
per device, made outside capture, shared by consecutive ops; two ops must not run at the same time on one device.
A buffer outgrown is kept (graphs captured with it still use it), so growing never breaks a captured graph.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from .dense_config import DenseLayout, SplitKConfig, splitk_grid, splitk_programs
from .residency import resident_room

__all__ = ["dense_splitk", "splitk_prepare"]


# Integers that change between launches of one layer (the token count, the grid's shape): not specialised on.
_FREE = ("num_tokens", "groups", "row_blocks", "n_split", "k_tiles", "n_chunks")


@triton.jit
def _store_zeros(y_ptr, rows, row_ok, stride_ym, n_lo, n_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Zeros into columns [n_lo, n_hi) of the rows where row_ok, a column tile at a time."""
    zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=y_ptr.dtype.element_ty)
    for c0 in range(n_lo, n_hi, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (cols < n_hi)[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], zeros, mask=mask)


@triton.jit(do_not_specialize=list(_FREE))
def _dense_splitk_kernel(
    # pointers
    x_ptr,  # (M, K)
    y_ptr,  # (M, sum of the slices' N)
    a_ptrs,  # (S_slices,) int64 addresses of each slice's lora_a, (max_loras, [1,] rank, K)
    b_ptrs,  # (S_slices,) int64 addresses of each slice's lora_b, (max_loras, [1,] N_s, rank)
    slice_n_ptr,  # (S_slices,) int32 each slice's N
    slice_col_ptr,  # (S_slices,) int32 each slice's first column in y
    b_lora_stride_ptr,  # (S_slices,) int64 lora_b's stride between adapters
    sorted_ptr,  # (M,) token indices grouped by adapter
    count_ptr,  # (TABLE,) tokens per group, the first `groups` of them launched for
    start_ptr,  # (groups + 1,) first position of each group in sorted_ptr
    ids_ptr,  # (TABLE,) adapter slot per group, -1 for rows without one
    part_ptr,  # (S_slices, M, SPLIT_PAD, RANK_PAD) float32 partial sums, one per K split
    count_words,  # (>= 2 * units,) int32 arrivals, departures per unit; zero at rest
    # sizes
    num_tokens,
    groups,
    row_blocks,  # a bound on the groups' row blocks of BLOCK_M: sum of cdiv(count, BLOCK_M)
    K,
    rank,
    scale,
    n_split,  # S: shrink programs per unit
    k_tiles,  # K tiles (BLOCK_K) per shrink program
    n_chunks,  # expand programs per unit
    # strides
    stride_xm,
    stride_ym,
    stride_al,
    stride_ar,
    stride_bn,
    # meta
    NUM_SLICES: tl.constexpr,
    GROUPS_PAD: tl.constexpr,  # the tables' length rounded up to a power of two
    TABLE: tl.constexpr,  # the count and id tables' length (vLLM's max_loras + 1)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RANK_PAD: tl.constexpr,
    SPLIT_PAD: tl.constexpr,
    ADD: tl.constexpr,
):
    pid = tl.program_id(0)
    units = NUM_SLICES * row_blocks
    producer = pid < n_split * units
    index = tl.where(producer, pid, pid - n_split * units)
    per_unit = tl.where(producer, n_split, n_chunks)
    part = index % per_unit  # the producer's K split, or the consumer's run of column tiles
    unit = index // per_unit
    slice_id = unit % NUM_SLICES
    block = unit // NUM_SLICES
    # Row blocks numbered over the groups in order: block b is in the first group whose blocks end past b.
    g = tl.arange(0, GROUPS_PAD)
    table = tl.load(count_ptr + g, mask=g < TABLE, other=0)
    counts = tl.where(g < groups, table, 0)
    blocks = tl.cdiv(counts, BLOCK_M)
    ends = tl.cumsum(blocks, 0)
    group = tl.sum((ends <= block).to(tl.int32))
    if group >= groups:
        return  # past the last group's last block (row_blocks is a bound)
    here = g == group
    count = tl.sum(tl.where(here, counts, 0))
    m0 = (block - tl.sum(tl.where(here, ends - blocks, 0))) * BLOCK_M
    lora = tl.load(ids_ptr + group)
    first = tl.load(start_ptr + group)
    dtype = y_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    ranks = tl.arange(0, RANK_PAD)
    row_ok = m0 + offs_m < count
    positions = first + m0 + offs_m  # rows' places in the grouping, which index the partials
    rows = tl.load(sorted_ptr + positions, mask=row_ok, other=0)
    counter = count_words + 2 * unit
    part_rows = part_ptr + ((slice_id * num_tokens + positions).to(tl.int64) * SPLIT_PAD) * RANK_PAD

    if producer:
        if lora == -1:
            return
        a_base = tl.load(a_ptrs + slice_id).to(tl.pointer_type(dtype)) + lora * stride_al
        k_lo = part * k_tiles * BLOCK_K
        k_hi = tl.minimum(k_lo + k_tiles * BLOCK_K, K)
        acc = tl.zeros((BLOCK_M, RANK_PAD), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < k_hi
            x = tl.load(
                x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
            )
            a = tl.load(
                a_base + ranks[:, None] * stride_ar + ks[None, :],
                mask=(ranks < rank)[:, None] & k_ok[None, :],
                other=0.0,
            )
            acc += tl.dot(x, tl.trans(a))
        tl.store(part_rows[:, None] + part * RANK_PAD + ranks[None, :], acc, mask=row_ok[:, None])
        # Every thread's store is done (the barrier) before one release-add counts this partial.
        tl.debug_barrier()
        tl.atomic_add(counter, 1, sem="release", scope="gpu")
    else:
        n = tl.load(slice_n_ptr + slice_id)
        n_tiles = tl.cdiv(n, BLOCK_N)
        span = tl.cdiv(n_tiles, n_chunks)  # column tiles per expand program of this slice
        active = tl.cdiv(n_tiles, span)  # the slice's expand programs that have columns
        if part >= active:
            return
        column0 = tl.load(slice_col_ptr + slice_id)
        n_lo = part * span * BLOCK_N
        n_hi = tl.minimum(n_lo + span * BLOCK_N, n)
        if not ADD and block == 0:
            # Rows past the grouped tokens (vLLM pads a batch to a captured graph's size and groups only the tokens
            # it scheduled) are in no group: the first row block's expand programs write them zeros, so a written
            # output needs no fill first. Their start sums the whole count table (vLLM zeroes it every step), not
            # the `groups` a graph was captured with, which a replay may outgrow.
            for r0 in range(tl.sum(table), num_tokens, BLOCK_M):
                tail = r0 + offs_m
                _store_zeros(y_ptr + column0, tail, tail < num_tokens, stride_ym, n_lo, n_hi, BLOCK_M, BLOCK_N)
        if lora == -1:
            if not ADD:
                _store_zeros(y_ptr + column0, rows, row_ok, stride_ym, n_lo, n_hi, BLOCK_M, BLOCK_N)
            return
        b_base = tl.load(b_ptrs + slice_id).to(tl.pointer_type(dtype)) + lora * tl.load(b_lora_stride_ptr + slice_id)
        # B's first tile (weights only) is in flight through the wait.
        cols = n_lo + tl.arange(0, BLOCK_N)
        b_mask = (cols < n_hi)[:, None] & (ranks < rank)[None, :]
        b = tl.load(b_base + cols[:, None] * stride_bn + ranks[None, :], mask=b_mask, other=0.0)
        # Polled with the acquire read-modify-write itself: volatile loads, then one acquire, were 0.5-2.1 µs slower
        # for q/k/v at M = 16 and 64 on an H200 and 0.2-0.5 µs faster at M = 1 (docs/benchmarks.md).
        while tl.atomic_add(counter, 0, sem="acquire", scope="gpu") < n_split:
            pass
        # The S partials, (BLOCK_M, RANK_PAD) each, in an unrolled loop: every load in flight at once.
        part_ptrs = part_rows[:, None] + ranks[None, :]
        h = tl.zeros((BLOCK_M, RANK_PAD), dtype=tl.float32)
        for s in tl.static_range(SPLIT_PAD):
            split_ok = (ranks * 0 + s < n_split)[None, :]  # a tensor: the interpreter takes no Python bool
            h += tl.load(part_ptrs + s * RANK_PAD, mask=row_ok[:, None] & split_ok, other=0.0, cache_modifier=".cg")
        # The last sibling past the wait zeroes the unit's words for the next op.
        if tl.atomic_add(counter + 1, 1, sem="relaxed", scope="gpu") == active - 1:
            tl.store(counter, 0)
            tl.store(counter + 1, 0)
        hb = (h * scale).to(dtype)
        for c0 in range(n_lo, n_hi, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            col_ok = cols < n_hi
            if c0 > n_lo:
                b = tl.load(
                    b_base + cols[:, None] * stride_bn + ranks[None, :],
                    mask=col_ok[:, None] & (ranks < rank)[None, :],
                    other=0.0,
                )
            out = tl.dot(hb, tl.trans(b))
            out_ptrs = y_ptr + rows[:, None] * stride_ym + column0 + cols[None, :]
            out_mask = row_ok[:, None] & col_ok[None, :]
            if ADD:
                out += tl.load(out_ptrs, mask=out_mask, other=0.0).to(tl.float32)
            tl.store(out_ptrs, out.to(dtype), mask=out_mask)


_counters: dict[torch.device, torch.Tensor] = {}
_outgrown: list[torch.Tensor] = []  # buffers replaced by larger ones: graphs captured with them still use them


def _counter_words(device: torch.device, size: int) -> torch.Tensor:
    """This device's counter words, zero at rest; grown only outside CUDA-graph capture (a graph keeps the address,
    so the old buffer is kept alive)."""
    buf = _counters.get(device)
    if buf is None or buf.numel() < size:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("dense_splitk: run once outside capture at the largest size first")
        if buf is not None:
            _outgrown.append(buf)
        buf = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        _counters[device] = buf
    return buf


_resident: dict[tuple, int] = {}

_Meta = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]


def _plan(
    y: torch.Tensor,
    x: torch.Tensor,
    layout: DenseLayout,
    meta: _Meta,
    *,
    scale: float,
    add: bool,
    config: SplitKConfig,
) -> tuple[tuple[int], tuple, dict]:
    """(grid, arguments, constexprs) of one launch; allocates the partials and the counter words."""
    sorted_ids, counts, starts, ids, groups = meta
    m, slices = x.shape[0], layout.slice_n.numel()
    rank_pad = max(16, triton.next_power_of_2(layout.rank))
    n_split, k_tiles = splitk_grid(k=layout.k, block_k=config.block_k, split_k=config.split_k)
    programs, units = splitk_programs(m=m, groups=groups, slices=slices, k=layout.k, config=config)
    row_blocks = units // slices
    partials = torch.empty((slices, m, triton.next_power_of_2(n_split), rank_pad), dtype=torch.float32, device=x.device)
    words = _counter_words(x.device, 2 * units)
    args = (
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
        partials,
        words,
        m,
        groups,
        row_blocks,
        layout.k,
        layout.rank,
        scale,
        n_split,
        k_tiles,
        config.n_chunks,
        x.stride(0),
        y.stride(0),
        layout.stride_al,
        layout.stride_ar,
        layout.stride_bn,
    )
    consts = {
        "NUM_SLICES": slices,
        # From the id table's length (vLLM's max_loras + 1), not the group count: one variant whatever the number of
        # active adapters a CUDA graph was captured for.
        "GROUPS_PAD": triton.next_power_of_2(ids.numel()),
        "TABLE": ids.numel(),
        "BLOCK_M": 16,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "RANK_PAD": rank_pad,
        "SPLIT_PAD": triton.next_power_of_2(n_split),
        "ADD": add,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }
    return (programs,), args, consts


def dense_splitk(
    y: torch.Tensor,
    x: torch.Tensor,
    layout: DenseLayout,
    meta: _Meta,
    *,
    scale: float = 1.0,
    add: bool = True,
    split_k: int = 8,
    block_k: int = 128,
    n_chunks: int = 8,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> None:
    """One launch for all slices, K split over up to `split_k` programs per (slice, row block), the columns over
    `n_chunks` expand programs. x (M, K), y (M, sum of the slices' N), both with a contiguous last dimension. meta:
    (sorted token indices (M,), tokens per group (G,), group starts (G + 1,), group adapter ids (G,), number of
    groups), as vLLM's `LoRAKernelMeta.meta_args` gives them; `add`: y += LoRA, else y = LoRA (zeros in rows without
    an adapter). Raises ValueError, launching nothing, when the grid does not fit on the GPU at once."""
    if meta[4] == 0:
        return
    config = SplitKConfig(split_k, block_k, n_chunks, block_n, num_warps, num_stages)
    grid, args, consts = _plan(y, x, layout, meta, scale=scale, add=add, config=config)
    if x.device.type == "cuda" and grid[0] > _room(x.device, args, consts):
        raise ValueError(f"dense_splitk: {grid[0]} programs do not fit on the GPU at once")
    _dense_splitk_kernel[grid](*args, **consts)


def splitk_prepare(
    y: torch.Tensor, x: torch.Tensor, layout: DenseLayout, meta: _Meta, *, add: bool, config: SplitKConfig
) -> int:
    """Compile the variant these arguments launch, grow the counter words to its grid and return how many programs
    of it the GPU holds at once (no bound off CUDA). Launches nothing; not inside CUDA-graph capture. With the largest
    M and group count a caller will launch, later launches of that variant need no compile and no new buffer."""
    _, args, consts = _plan(y, x, layout, meta, scale=1.0, add=add, config=config)
    return _room(x.device, args, consts) if x.device.type == "cuda" else sys.maxsize


def _room(device: torch.device, args: tuple, consts: dict) -> int:
    """Programs of this kernel variant the GPU holds at once, from the compiled kernel's registers and shared memory
    (compiled, not launched, once per key: the constexprs and what Triton specialises the other arguments on)."""

    def spec(name: str, v: object) -> object:
        if isinstance(v, torch.Tensor):
            return (v.dtype, v.data_ptr() % 16 == 0)
        if name in _FREE or isinstance(v, float):  # not specialised: any value runs the same compiled kernel
            return None
        if isinstance(v, int) and not isinstance(v, bool):
            return (v == 1, v % 16 == 0)
        return v

    names = _dense_splitk_kernel.arg_names
    key = (device, tuple(sorted(consts.items())), tuple(spec(n, v) for n, v in zip(names, args, strict=False)))
    if key not in _resident:
        kernel = _dense_splitk_kernel.warmup(*args, grid=(1,), **consts)
        kernel._init_handles()
        _resident[key] = resident_room(device.index or 0, kernel.n_regs, kernel.metadata.shared, consts["num_warps"])
    return _resident[key]
