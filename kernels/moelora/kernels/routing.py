"""Group (token, slot) pairs by (adapter, expert) on the GPU, with no host synchronisation.

A pair p = t * top_k + k belongs to group g = adapter * E + expert (adapter = token_lora_mapping[t], expert =
topk_ids[t, k]); pairs without an adapter (-1) or with an expert outside [0, E) (expert parallelism's -1) are
dropped. The result lists the pairs group by group (`sorted_pairs`) and cuts each group into blocks of at most
`block_m` pairs; one block is one CTA row of the compute kernels, so each CTA reads one (adapter, expert) weight
slice and every touched weight is read once per block (once in all when a group fits in one block, as it does at
decode sizes).

Counting sort in two or one launches:
- count: each pair takes its rank inside its group from a relaxed atomic_add on the group's counter;
- finish: every CTA recomputes the exclusive prefix sum of the counts in registers (G <= a few thousand groups,
  cheaper than another launch), scatters its pairs to `start[g] + rank`, and CTA 0 writes the block table.
When all pairs fit in one CTA (decode sizes) a single launch does both with the counters zeroed in-kernel, which
saves the memset and one dependent launch.

Or no grouping at all ("direct"): every pair is its own block, found by the compute kernels from topk_ids and the
token map themselves. No routing launch sits in front of the op; pairs that share an (adapter, expert) read its
weights once each, the repeats mostly from L2. That pays only while few pairs share a group (decode).

"onepass" is direct routing whose ops each run as one kernel (onepass.py): a pair's shrink split over several
CTAs that hand the rank intermediate to each other inside the kernel, where the two-kernel path pays a second launch
and a kernel boundary. It pays at decode sizes, where those dominate.

Block capacity is static so the launch grids are known on the host: there are at most
min(P, G) + P // block_m non-empty blocks (one partial block per non-empty group plus full ones).

The grouping kernels also zero `ready`, one counter per block for each of the first READY_SLOTS ops launched on
the routing: an op's shrink CTAs count into their block's counter once their partial sums are stored, and the
expand's CTAs wait for their own block's count instead of for the whole shrink grid (see fused.py). The
thresholds below that pick a method were set from layer timings; docs/benchmarks-history.md (Kernels) has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from ._pdl import use_pdl
from .routing_kernels import _route_count_kernel, _route_finish_kernel, _route_tiny_kernel

__all__ = ["MoeLoraRouting", "moe_lora_routing", "routing_switches"]

# Pairs handled by one CTA of the routing kernels; also the largest pair count the single-launch path takes
# (M <= 256 tokens at top_k 4, M <= 128 at top_k 8).
_ROUTE_BLOCK = 1024
# Pairs the register-only path takes: its comparison matrices are BLOCK x BLOCK with BLOCK = next power of two
# >= P, so its cost grows with the square of P. `auto` uses it up to _TINY_AUTO pairs only, where it beats
# "single" in the whole layer; from ~64 pairs on it does not (docs/benchmarks-history.md, Kernels).
_TINY_BLOCK = 256
_TINY_AUTO = 32
# `auto` leaves pairs ungrouped ("direct") while they are at most this fraction of the (adapter, expert) groups:
# while few pairs share a group's weights, skipping the grouping launch beats reading a shared slice once
# (docs/benchmarks-history.md, Kernels: direct routing at decode).
_DIRECT_MAX_SHARE = 0.5
# `decode` runs ops as one kernel each (onepass) up to this many pairs.
_ONE_PASS_DECODE = 128
# Ops on one routing that get per-block readiness counters (a layer has two, or three when vLLM splits gate_up);
# later ones wait for their shrink grid as a whole.
READY_SLOTS = 4


@dataclass(frozen=True)
class MoeLoraRouting:
    """Pairs grouped by (adapter, expert); all tensors live on the device, the ints on the host.

    sorted_pairs: (P,) int32, pair ids t * top_k + k, group by group; entries past the valid ones are unused.
    block_table: (3, max_blocks) int32, rows: group id, first and one-past-last position in sorted_pairs.
    num_blocks: (1,) int32, the number of valid rows of block_table.
    topk_ids: (P,) the flattened expert ids; token_lora: (M,) the adapter slots (read by the kernels when direct).
    direct: no grouping was done; block b is pair b, and sorted_pairs / block_table / num_blocks are not read.
    one_pass: direct, and each op runs as one kernel where its CTAs fit on the GPU at once (onepass.py).
    """

    sorted_pairs: torch.Tensor
    block_table: torch.Tensor
    num_blocks: torch.Tensor
    num_pairs: int
    top_k: int
    num_experts: int
    max_loras: int
    block_m: int
    max_blocks: int
    topk_ids: torch.Tensor
    token_lora: torch.Tensor
    direct: bool = False
    one_pass: bool = False
    ready: torch.Tensor | None = None  # (READY_SLOTS, >= max_blocks) int32, rows 16-byte aligned, zeroed by routing
    _ops_begun: list[int] = field(default_factory=lambda: [0], repr=False, compare=False)

    def begin_op(self, *, per_block_wait: bool) -> tuple[bool, torch.Tensor | None]:
        """Count one more op launched on this routing. Returns whether an earlier op was (its kernels may then read
        the routing before their wait for the previous kernel: the first op's shrink waited for the routing kernel
        before it let anything after it start), and, when per_block_wait, the op's readiness counters (max_blocks,):
        slot i for the i-th op, None with direct routing or past READY_SLOTS ops. Ops launched on one routing must
        share its stream."""
        index = self._ops_begun[0]
        self._ops_begun[0] += 1
        if not per_block_wait or self.ready is None or index >= self.ready.shape[0]:
            return index > 0, None
        return index > 0, self.ready[index]


def resolve_method(method: str, num_pairs: int, num_groups: int) -> str:
    """The routing method `method` stands for with this many (token, slot) pairs over this many (adapter, expert)
    groups: "auto" is direct while pairs are at most _DIRECT_MAX_SHARE of the groups, else as "grouped"; "decode" is
    onepass up to _ONE_PASS_DECODE pairs, else as "grouped"; "grouped" is the first of tiny, single, multi that
    fits; any other name stands for itself."""
    if method == "decode" and num_pairs <= _ONE_PASS_DECODE:
        return "onepass"
    if method == "auto" and num_pairs <= _DIRECT_MAX_SHARE * num_groups:
        return "direct"
    if method in ("auto", "decode", "grouped"):
        return "tiny" if num_pairs <= _TINY_AUTO else "single" if num_pairs <= _ROUTE_BLOCK else "multi"
    return method


def routing_switches() -> tuple[int, ...]:
    """Pair counts P at which `grouped` or `decode` routing launches something else from P + 1 pairs on: the tiny
    kernel's block doubles (16), tiny gives way to single (_TINY_AUTO), onepass to grouped (_ONE_PASS_DECODE),
    single to multi (_ROUTE_BLOCK). A warm-up that runs P and P + 1 at each compiles both sides."""
    return (16, _TINY_AUTO, _ONE_PASS_DECODE, _ROUTE_BLOCK)


def method_takes(method: str, num_pairs: int) -> bool:
    """Whether routing method `method` can group this many pairs: "tiny" holds them in one CTA's registers, "single"
    in one CTA; the others take any number."""
    return not ((method == "tiny" and num_pairs > _TINY_BLOCK) or (method == "single" and num_pairs > _ROUTE_BLOCK))


def max_blocks_for(num_pairs: int, num_groups: int, block_m: int) -> int:
    """Static upper bound on the number of non-empty blocks (see the module docstring)."""
    return max(1, min(num_pairs, num_groups) + num_pairs // block_m)


def moe_lora_routing(
    *,
    topk_ids: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    num_experts: int,
    max_loras: int,
    block_m: int,
    pdl: bool | None = None,
    method: str = "auto",
) -> MoeLoraRouting:
    """Group the (token, slot) pairs by (adapter, expert), on the device and without host synchronisation.

    topk_ids: (M, top_k) int32/int64 expert ids (entries outside [0, num_experts) are skipped);
    token_lora_mapping: (M,) int32/int64 adapter slot per token, -1 for none (also skipped past max_loras);
    block_m: pairs per block, a power of two >= 16 (the compute kernels' BLOCK_M);
    pdl: programmatic dependent launch, None = where supported (see _pdl.use_pdl);
    method: "direct" (no launch: one block per pair, see the module docstring), "onepass" (direct, each op one
        kernel where it fits), "tiny" (<= 256 pairs, one launch,
        all in registers), "single" (<= 1024 pairs, one launch with global atomics), "multi" (two launches and a
        memset); "grouped": the first of tiny, single, multi that fits; "auto": direct while pairs are at most
        half the groups (adapters x experts), else grouped; "decode": onepass up to 128 pairs, else grouped.
    The result can be shared by the gate_up and down ops of a layer (same routing, same block_m).
    """
    if topk_ids.dim() != 2 or token_lora_mapping.shape != (topk_ids.shape[0],):
        raise ValueError(
            f"topk_ids (M, top_k) and token_lora_mapping (M,) expected, got {tuple(topk_ids.shape)} "
            f"and {tuple(token_lora_mapping.shape)}"
        )
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16, got {block_m}")
    m, top_k = topk_ids.shape
    num_pairs = m * top_k
    num_groups = num_experts * max_loras
    dev = topk_ids.device
    topk_flat = topk_ids.contiguous().view(-1)
    lora = token_lora_mapping.contiguous()
    method = resolve_method(method, num_pairs, num_groups)
    if method in ("direct", "onepass"):
        return MoeLoraRouting(
            sorted_pairs=topk_flat,
            block_table=topk_flat,
            num_blocks=topk_flat,
            num_pairs=num_pairs,
            top_k=top_k,
            num_experts=num_experts,
            max_loras=max_loras,
            block_m=block_m,
            max_blocks=max(1, num_pairs),
            topk_ids=topk_flat,
            token_lora=lora,
            direct=True,
            one_pass=method == "onepass",
        )
    max_blocks = max_blocks_for(num_pairs, num_groups, block_m)
    sorted_pairs = torch.empty(max(num_pairs, 1), dtype=torch.int32, device=dev)
    block_table = torch.empty((3, max_blocks), dtype=torch.int32, device=dev)
    num_blocks = torch.empty(1, dtype=torch.int32, device=dev)
    # Rows padded to 4 counters (16 bytes): Triton specialises a pointer on its 16-byte alignment, so an op's slot
    # must be aligned whatever max_blocks (the token count) is, or a later op's kernels compile anew mid-serving.
    ready = torch.empty((READY_SLOTS, triton.cdiv(max_blocks, 4) * 4), dtype=torch.int32, device=dev)
    group_end = torch.empty(num_groups, dtype=torch.int32, device=dev)
    groups_pad = triton.next_power_of_2(max(num_groups, 16))
    pdl = use_pdl(dev) if pdl is None else pdl
    if method not in ("tiny", "single", "multi"):
        raise ValueError(f"unknown routing method {method!r}")
    if not method_takes(method, num_pairs):
        raise ValueError(f"routing method {method!r} cannot take {num_pairs} pairs")
    if method == "tiny":
        _route_tiny_kernel[(1,)](
            topk_flat,
            lora,
            sorted_pairs,
            block_table,
            num_blocks,
            ready,
            num_pairs,
            top_k,
            num_experts,
            max_loras,
            max_blocks,
            ready.numel(),
            BLOCK=max(16, triton.next_power_of_2(num_pairs)),
            BLOCK_M=block_m,
            USE_PDL=pdl,
            num_warps=8 if num_pairs <= 128 else 16,
            **({"launch_pdl": True} if pdl else {}),
        )
        return MoeLoraRouting(
            sorted_pairs=sorted_pairs,
            block_table=block_table,
            num_blocks=num_blocks,
            num_pairs=num_pairs,
            top_k=top_k,
            num_experts=num_experts,
            max_loras=max_loras,
            block_m=block_m,
            max_blocks=max_blocks,
            topk_ids=topk_flat,
            token_lora=lora,
            ready=ready,
        )
    single = method == "single"
    # PDL for the finish kernel only: the count kernel follows a memset, not a kernel.
    if single:
        counts = torch.empty(num_groups, dtype=torch.int32, device=dev)
        rank = sorted_pairs  # not read when SINGLE
        grid = (1,)
    else:
        counts = torch.zeros(num_groups, dtype=torch.int32, device=dev)
        rank = torch.empty(num_pairs, dtype=torch.int32, device=dev)
        grid = (triton.cdiv(num_pairs, _ROUTE_BLOCK),)
        _route_count_kernel[grid](
            topk_flat, lora, counts, rank, num_pairs, top_k, num_experts, max_loras, BLOCK=_ROUTE_BLOCK
        )
    _route_finish_kernel[grid](
        topk_flat,
        lora,
        counts,
        rank,
        group_end,
        sorted_pairs,
        block_table,
        num_blocks,
        ready,
        num_pairs,
        top_k,
        num_experts,
        max_loras,
        max_blocks,
        ready.numel(),
        BLOCK=_ROUTE_BLOCK,
        GROUPS_PAD=groups_pad,
        BLOCK_M=block_m,
        SINGLE=single,
        USE_PDL=pdl,
        num_warps=8,
        **({"launch_pdl": True} if pdl else {}),
    )
    return MoeLoraRouting(
        sorted_pairs=sorted_pairs,
        block_table=block_table,
        num_blocks=num_blocks,
        num_pairs=num_pairs,
        top_k=top_k,
        num_experts=num_experts,
        max_loras=max_loras,
        block_m=block_m,
        max_blocks=max_blocks,
        topk_ids=topk_flat,
        token_lora=lora,
        ready=ready,
    )
