"""The routing's Triton kernels: counting sort of (token, slot) pairs by (adapter, expert), and the block table.

routing.py chooses the method and launches these; its docstring describes the algorithm.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _pair_groups(topk_ids_ptr, lora_ptr, offs, num_pairs, top_k, num_experts, max_loras):
    """Group id of each pair in offs and whether it takes part."""
    in_range = offs < num_pairs
    expert = tl.load(topk_ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    adapter = tl.load(lora_ptr + offs // top_k, mask=in_range, other=-1).to(tl.int32)
    valid = in_range & (expert >= 0) & (expert < num_experts) & (adapter >= 0) & (adapter < max_loras)
    return adapter * num_experts + expert, valid


@triton.jit
def _zero(ptr, n, BLOCK: tl.constexpr):
    for i in range(0, n, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        tl.store(ptr + offs, tl.zeros([BLOCK], tl.int32), mask=offs < n)


@triton.jit
def _write_block_table(counts, ends, groups, group_mask, table_ptr, num_blocks_ptr, max_blocks, BLOCK_M: tl.constexpr):
    """Cut each group's range [ends - counts, ends) into blocks of BLOCK_M; rows of table_ptr: group, start, end."""
    nblk = tl.where(group_mask, (counts + BLOCK_M - 1) // BLOCK_M, 0)
    blk_end = tl.cumsum(nblk, 0)
    blk_start = blk_end - nblk
    starts = ends - counts
    for j in range(tl.max(nblk, 0)):
        has = j < nblk
        idx = blk_start + j
        first = starts + j * BLOCK_M
        tl.store(table_ptr + idx, groups, mask=has)
        tl.store(table_ptr + max_blocks + idx, first, mask=has)
        tl.store(table_ptr + 2 * max_blocks + idx, tl.minimum(first + BLOCK_M, ends), mask=has)
    tl.store(num_blocks_ptr, tl.sum(nblk, 0))


@triton.jit(do_not_specialize=["num_pairs"])
def _route_count_kernel(
    # pointers
    topk_ids_ptr,  # (P,) int, flattened (M, top_k)
    lora_ptr,  # (M,) int, -1 = no adapter
    counts_ptr,  # (G,) int32, zero on entry
    rank_ptr,  # (P,) int32, out: rank of each pair within its group
    # sizes
    num_pairs,
    top_k,
    num_experts,
    max_loras,
    # meta
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    group, valid = _pair_groups(topk_ids_ptr, lora_ptr, offs, num_pairs, top_k, num_experts, max_loras)
    rank = tl.atomic_add(counts_ptr + group, tl.full([BLOCK], 1, tl.int32), mask=valid, sem="relaxed")
    tl.store(rank_ptr + offs, rank, mask=valid)


@triton.jit(do_not_specialize=["num_pairs", "max_blocks", "ready_len"])
def _route_finish_kernel(
    # pointers
    topk_ids_ptr,  # (P,) int
    lora_ptr,  # (M,) int
    counts_ptr,  # (G,) int32; zeroed here when SINGLE, else filled by _route_count_kernel
    rank_ptr,  # (P,) int32, from _route_count_kernel (unused when SINGLE)
    group_end_ptr,  # (G,) int32 scratch: inclusive prefix sum of counts
    sorted_ptr,  # (P,) int32, out
    table_ptr,  # (3, max_blocks) int32, out
    num_blocks_ptr,  # (1,) int32, out
    ready_ptr,  # (ready_len,) int32, out: zeroed
    # sizes
    num_pairs,
    top_k,
    num_experts,
    max_loras,
    max_blocks,
    ready_len,
    # meta
    BLOCK: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SINGLE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # topk_ids and the counts come from earlier kernels
        tl.extra.cuda.gdc_launch_dependents()
    num_groups = num_experts * max_loras
    groups = tl.arange(0, GROUPS_PAD)
    group_mask = groups < num_groups
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    group, valid = _pair_groups(topk_ids_ptr, lora_ptr, offs, num_pairs, top_k, num_experts, max_loras)
    if SINGLE:
        tl.store(counts_ptr + groups, tl.zeros([GROUPS_PAD], tl.int32), mask=group_mask)
        tl.debug_barrier()
        rank = tl.atomic_add(counts_ptr + group, tl.full([BLOCK], 1, tl.int32), mask=valid, sem="relaxed")
        tl.debug_barrier()
    else:
        rank = tl.load(rank_ptr + offs, mask=valid, other=0)
    counts = tl.load(counts_ptr + groups, mask=group_mask, other=0, volatile=True)
    ends = tl.cumsum(counts, 0)
    # Every CTA writes the same prefix sums, then reads back its pairs' group starts (a register tensor cannot be
    # gathered from); the barrier makes this CTA's own stores visible to all of its threads.
    tl.store(group_end_ptr + groups, ends, mask=group_mask)
    tl.debug_barrier()
    start = tl.load(group_end_ptr + group, mask=valid, other=0, volatile=True) - tl.load(
        counts_ptr + group, mask=valid, other=0, volatile=True
    )
    tl.store(sorted_ptr + start + rank, offs, mask=valid)
    if pid == 0:
        _write_block_table(counts, ends, groups, group_mask, table_ptr, num_blocks_ptr, max_blocks, BLOCK_M)
        _zero(ready_ptr, ready_len, BLOCK)


@triton.jit(do_not_specialize=["num_pairs", "max_blocks", "ready_len"])
def _route_tiny_kernel(
    # pointers
    topk_ids_ptr,  # (P,) int
    lora_ptr,  # (M,) int
    sorted_ptr,  # (P,) int32, out
    table_ptr,  # (3, max_blocks) int32, out
    num_blocks_ptr,  # (1,) int32, out
    ready_ptr,  # (ready_len,) int32, out: zeroed
    # sizes
    num_pairs,
    top_k,
    num_experts,
    max_loras,
    max_blocks,
    ready_len,
    # meta
    BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """All pairs in registers, no atomics, no barriers, no scratch: position of pair i =
    #(valid j with group_j < group_i) + #(valid j < i with group_j == group_i), from BLOCK x BLOCK comparisons."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.arange(0, BLOCK)
    group, valid = _pair_groups(topk_ids_ptr, lora_ptr, offs, num_pairs, top_k, num_experts, max_loras)
    valid_j = valid[None, :]
    same = (group[None, :] == group[:, None]) & valid_j
    rank = tl.sum((same & (offs[None, :] < offs[:, None])).to(tl.int32), axis=1)
    count = tl.sum(same.to(tl.int32), axis=1)
    pos = tl.sum(((group[None, :] < group[:, None]) & valid_j).to(tl.int32), axis=1) + rank
    tl.store(sorted_ptr + pos, offs, mask=valid)
    first = valid & (rank % BLOCK_M == 0)  # the pair that opens a block
    block = tl.sum((first[None, :] & (pos[None, :] < pos[:, None])).to(tl.int32), axis=1)
    tl.store(table_ptr + block, group, mask=first)
    tl.store(table_ptr + max_blocks + block, pos, mask=first)
    tl.store(table_ptr + 2 * max_blocks + block, pos + tl.minimum(count - rank, BLOCK_M), mask=first)
    tl.store(num_blocks_ptr, tl.sum(first.to(tl.int32), 0))
    _zero(ready_ptr, ready_len, BLOCK)
