"""The fused MoE-LoRA op: output[t, k] += scale * (x_row @ A[a, e].T) @ B[a, e].T for every routed pair.

Two kernels per op, both walking the blocks of a `MoeLoraRouting`: grouped, a block is up to BLOCK_M pairs that
share one (adapter, expert), listed in the routing's block table; direct (decode sizes), a block is one pair, found
from topk_ids and the token map, and both kernels do vector math on that one row instead of a 16-row tl.dot.
- shrink: grid (blocks, SPLIT_K). Each CTA reduces one K-range of x_rows @ A.T into a float32 partial sum of
  shape (BLOCK_M, r), stored, not atomically added: the expand sums the SPLIT_K partials. That keeps the op
  deterministic and needs no zeroed buffer (a memset node saved), and the partials are tiny (P x r x 4 bytes,
  L2-resident) while at decode only the valid rows are loaded.
- expand: grid (blocks, N / BLOCK_N). Each CTA sums the partials, rounds them to the weights' dtype (as vLLM does),
  multiplies by its (r, BLOCK_N) tile of B, scales by the routed weight if asked, and adds into the output rows in
  place (the add is fused: one read and one write of each output element). A CTA may take N_TILES tiles in a row:
  grouped, they are a loop that Triton software-pipelines with num_stages > 1 (cp.async into shared memory, so the
  B bytes in flight do not cost registers); direct, the next tile's load is issued before this tile's arithmetic.
CTA order is the L2 swizzle: the routing lists a group's blocks (adapter, expert, up to BLOCK_M pairs each) next to
each other and the block index varies fastest in both grids, so the blocks of one group run side by side and read
its A and B slices while they are in L2 (at M = 1600, ~2 blocks per GPT-OSS group, the layer reaches 75% of copy
bandwidth against a floor that counts each slice once). Block-major order, a block's CTAs adjacent, measured slower.
Splitting shrink and expand, rather than vLLM's one-shot kernel that recomputes the shrink in every N-tile CTA,
reads each A slice once instead of once per N-tile CTA (estimate, GPT-OSS w13 at M=16 split 8 ways over N: 1.5 MB
of L2 reads of A per 0.55 MB of weights). Measured on an H200, the whole layer (routing + both ops) runs 1.8-3.5x
faster than vLLM 0.33's best path (docs/benchmarks.md, Kernels).
Programmatic dependent launch (SM90+) chains routing -> shrink -> expand: 3-5 us saved per layer at M <= 64.
With grouped routing the expand does not wait for the whole shrink grid either (wait_per_block): each shrink CTA
adds one to its block's readiness counter (zeroed by the routing kernel) once its partial sums are stored, and an
expand CTA, having fetched its first B tile, waits until its own block's counter reaches SPLIT_K. H200, GPT-OSS
layer: 2-4 us less at M = 256 and 1600 tokens. Such an expand lets the next kernel start at once (that kernel waits
for the whole grid before it reads our output), and the next op on the same routing (the down op) fetches its
block and first A tile before its own wait, as the routing is complete by then: 0.9 us less at M = 64.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from ._pdl import use_pdl
from .routing import MoeLoraRouting

__all__ = ["KernelConfig", "default_block_m", "default_config", "fused_moe_lora", "table_token_counts", "use_pdl"]


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of one op. block_m lives in the routing (shared by a layer's two ops)."""

    split_k: int = 1
    shrink_block_k: int = 64
    shrink_warps: int = 4
    shrink_stages: int = 3
    expand_block_n: int = 128
    expand_warps: int = 4
    expand_stages: int = 1
    expand_tiles: int = 1  # BLOCK_N tiles per expand CTA
    # The expand waits for its own block's shrink CTAs (readiness counters; grouped routing) rather than for the
    # whole shrink grid.
    wait_per_block: bool = True
    # A register cap per thread (ptxas -maxnreg), None: the compiler's choice. Fewer registers, more CTAs per SM.
    shrink_maxnreg: int | None = None
    expand_maxnreg: int | None = None
    pdl: bool | None = None  # None: on where supported (use_pdl)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def default_block_m(*, num_pairs: int, num_groups: int) -> int:
    """Pairs per block. 16 everywhere: on an H200 (GPT-OSS and Qwen3 layers, rank 32, 8 adapters, M 1..1600) the
    sweep never picked 32 or 64, even at M=1600 where a GPT-OSS group holds ~25 pairs: more, smaller CTAs keep more
    loads in flight, and a group's second block finds its weights in L2."""
    del num_pairs, num_groups
    return 16


def default_config(
    *, routing: MoeLoraRouting, k: int, n: int, rank: int, device: torch.device, config_file: Path | None = None
) -> KernelConfig:
    """The bundled tuned configuration nearest to this problem (configs/<GPU name>.json, same K, N and E; nearest
    rank, adapter count and M on a log scale), else one from the sizes alone. config_file: read this file instead
    of the bundled one, on any device (the tuner's output, and its CPU test)."""
    tuned = _tuned_config(routing=routing, k=k, n=n, rank=rank, device=device, config_file=config_file)
    if tuned is not None:
        return tuned
    sms = _num_sms(device)
    block_k = 64 if k % 64 == 0 or k < 128 else 128
    k_iters = triton.cdiv(k, block_k)
    # Enough shrink CTAs to keep every SM streaming A: ~4 per SM (the H200 sweep's picks were within 2x of this).
    split_k = max(1, min(k_iters // 2, triton.cdiv(4 * sms, routing.max_blocks)))
    split_k = min(split_k, 16)
    block_n = 256 if rank <= 32 else 128
    return KernelConfig(split_k=split_k, shrink_block_k=block_k, expand_block_n=block_n)


def _config_file(device: torch.device) -> Path | None:
    """<GPU>.json from the folder the operator mounts for vLLM's own tuned files (VLLM_TUNED_CONFIG_FOLDER), so a
    ModelServer's kernel configs reach our kernel too; else the bundled one."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).replace(" ", "_").replace("-", "_")
    mounted = os.environ.get("VLLM_TUNED_CONFIG_FOLDER")
    for folder in ([Path(mounted)] if mounted else []) + [Path(__file__).with_name("configs")]:
        if (folder / f"{name}.json").is_file():
            return folder / f"{name}.json"
    return None


@functools.lru_cache(maxsize=8)
def _load_configs(path: Path) -> tuple[dict, ...]:
    return tuple(json.loads(path.read_text())["entries"])


def table_token_counts(device: torch.device) -> tuple[int, ...]:
    """The token counts (M) of the config table default_config reads on this device; () without one. Each is a
    boundary where the launch configuration may change, so a warm-up that runs these compiles every variant."""
    path = _config_file(device)
    return tuple(sorted({int(e["m"]) for e in _load_configs(path)})) if path is not None else ()


def _tuned_config(
    *, routing: MoeLoraRouting, k: int, n: int, rank: int, device: torch.device, config_file: Path | None = None
) -> KernelConfig | None:
    path = config_file if config_file is not None else _config_file(device)
    if path is None:
        return None
    m = max(1, routing.num_pairs // routing.top_k)
    candidates = [e for e in _load_configs(path) if (e["k"], e["n"], e["num_experts"]) == (k, n, routing.num_experts)]
    # An entry tuned with direct routing says so ("route": "direct"); prefer entries tuned with this routing's kind.
    kind = "direct" if routing.direct else "grouped"
    candidates = [e for e in candidates if e.get("route", "grouped") == kind] or candidates
    if not candidates:
        return None

    def distance(e: dict) -> tuple[float, float, float]:
        return (
            abs(math.log2(e["rank"] / rank)),
            abs(math.log2(e["max_loras"] / routing.max_loras)),
            abs(math.log2(e["m"] / m)),
        )

    return KernelConfig(**min(candidates, key=distance)["config"])


@triton.jit
def _block_span(
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
def _load_a_tile(a_ptrs, k0, offs_k, offs_r, K, rank, EVEN_K: tl.constexpr, EVEN_R: tl.constexpr):
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
def _load_x_tile(x_ptrs, k0, offs_k, mask_m, K, EVEN_K: tl.constexpr):
    """The (BLOCK_M, BLOCK_K) tile of a grouped block's input rows at K offset k0, zero in rows past the block's
    end and past K."""
    if EVEN_K:
        xt = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
    else:
        xt = tl.load(x_ptrs, mask=mask_m[:, None] & (k0 + offs_k < K)[None, :], other=0.0)
    return xt


@triton.jit
def _load_b_tile(b_ptrs, offs_n, offs_r, N, rank, EVEN_N: tl.constexpr, EVEN_R: tl.constexpr):
    """The (RANK_PAD, BLOCK_N) tile of B at columns offs_n, zero past N and past the rank.

    Each mask only where needed: a rank mask (a runtime bound along the contiguous rank axis) stops the compiler
    from vectorising the loads, and with it every B load became a 2-byte one (sm_90 PTX: ld.global.b16)."""
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
def _expand_row(
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
):
    """Direct pair pos through the (RANK_PAD, BLOCK_N) tile bt: sum its SPLIT_K partials, multiply, scale, and add
    into its output row; a broadcast multiply and a sum over the rank, not a tl.dot."""
    pair = tl.cast(pos, tl.int64)
    out_ptrs = out_ptr + pair * stride_om + offs_n * stride_on
    old = tl.load(out_ptrs, mask=offs_n < N, other=0.0)
    part_ptrs = part_ptr + pos * RANK_PAD + offs_r
    inter = tl.load(part_ptrs)
    for s in tl.static_range(1, SPLIT_K):
        inter += tl.load(part_ptrs + s * num_pairs * RANK_PAD)
    inter = inter.to(bt.dtype).to(tl.float32)  # rounded like the tile path's (and vLLM's) intermediate
    acc = tl.sum(inter[:, None] * bt.to(tl.float32), axis=0)
    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + pair * stride_w).to(tl.float32)
    tl.store(out_ptrs, (old.to(tl.float32) + acc).to(old.dtype), mask=offs_n < N)


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _shrink_kernel(
    # pointers
    x_ptr,  # (M, K) or (P, K): the op's input rows
    a_ptr,  # (max_loras, E, rank, K) lora_a
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
):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    if USE_PDL and not A_BEFORE_WAIT:
        # Wait for the routing (and whatever wrote x), then let the expand's CTAs start: they only read the
        # routing's tables and B before their own wait.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    adapter, expert, start, end, live = _block_span(
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
                at = _load_a_tile(a_ptrs, it * BLOCK_K, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
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
            at = _load_a_tile(a_ptrs, it_lo * BLOCK_K, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
            if USE_PDL:
                tl.extra.cuda.gdc_wait()
                tl.extra.cuda.gdc_launch_dependents()
            xt = _load_x_tile(x_ptrs, it_lo * BLOCK_K, offs_k, mask_m, K, EVEN_K)
            acc += tl.dot(xt, at.to(xt.dtype))
            x_ptrs += BLOCK_K * stride_xk
            a_ptrs += BLOCK_K * stride_ak
            it_first = it_lo + 1
        for it in range(it_first, it_hi):
            # A first: its address does not wait on the sorted-pairs load that x's does.
            at = _load_a_tile(a_ptrs, it * BLOCK_K, offs_k, offs_r, K, rank, EVEN_K, EVEN_R)
            xt = _load_x_tile(x_ptrs, it * BLOCK_K, offs_k, mask_m, K, EVEN_K)
            acc += tl.dot(xt, at.to(xt.dtype))
            x_ptrs += BLOCK_K * stride_xk
            a_ptrs += BLOCK_K * stride_ak
        tl.store(part + offs_m[:, None] * RANK_PAD + offs_r[None, :], acc, mask=mask_m[:, None])
        if READY:
            # Every thread's stores are done (the barrier) before one release-add counts this split as ready.
            tl.debug_barrier()
            tl.atomic_add(ready_ptr + pid_b, 1, sem="release", scope="gpu")


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _expand_kernel(
    # pointers
    part_ptr,  # (SPLIT_K, P, RANK_PAD) float32 partial sums from _shrink_kernel
    b_ptr,  # (max_loras, E, N, rank) lora_b
    out_ptr,  # (P, N) output rows (a (M, top_k, N) view), updated in place
    topk_w_ptr,  # (P,) routed weights, read when MUL_ROUTED_WEIGHT
    sorted_ptr,  # (P,) int32
    table_ptr,  # (3, max_blocks) int32
    num_blocks_ptr,  # (1,) int32
    topk_ptr,  # (P,) expert ids, read when DIRECT
    lora_ptr,  # (M,) adapter slots, read when DIRECT
    ready_ptr,  # (max_blocks,) int32 readiness counters, when READY
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
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    if USE_PDL and READY:
        # The next kernel waits for this whole grid before it reads anything of ours; starting it now lets its
        # CTAs take free SMs and fetch what does not depend on us (the down op's shrink: routing and A).
        tl.extra.cuda.gdc_launch_dependents()
    adapter, expert, start, end, live = _block_span(
        table_ptr, num_blocks_ptr, topk_ptr, lora_ptr, pid_b, max_blocks, num_experts, top_k, max_loras, DIRECT
    )
    if not live:
        return
    offs_r = tl.arange(0, RANK_PAD)
    offs_n = pid_n * (BLOCK_N * N_TILES) + tl.arange(0, BLOCK_N)
    b_ptrs = (
        b_ptr + adapter * stride_bl + expert * stride_be + offs_n[None, :] * stride_bn + offs_r[:, None] * stride_br
    )
    bt = _load_b_tile(b_ptrs, offs_n, offs_r, N, rank, EVEN_N, EVEN_R)
    if USE_PDL and not READY:
        # Everything above depends only on the routing, complete before the shrink let this grid start.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if DIRECT:
        # Vector math on the block's one pair (see the shrink); the next tile's load goes out before this tile's
        # arithmetic, so a CTA always has B in flight.
        for t in tl.static_range(N_TILES):
            if t + 1 < N_TILES:
                bt_next = _load_b_tile(
                    b_ptrs + (t + 1) * BLOCK_N * stride_bn, offs_n + (t + 1) * BLOCK_N, offs_r, N, rank, EVEN_N, EVEN_R
                )
            for pos in range(start, end):
                _expand_row(
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
                )
            if t + 1 < N_TILES:
                bt = bt_next
    else:
        offs_m = start + tl.arange(0, BLOCK_M)
        mask_m = offs_m < end
        pair = tl.load(sorted_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        out_ptrs = out_ptr + pair[:, None] * stride_om + offs_n[None, :] * stride_on
        # The output tile's load goes out before the partial sums' so the two round trips overlap.
        old = _load_out_tile(out_ptrs, offs_n, mask_m, N, EVEN_N)
        part_ptrs = part_ptr + offs_m[:, None] * RANK_PAD + offs_r[None, :]
        if READY:
            # Wait for this block's SPLIT_K shrink CTAs only, not the whole shrink grid. No deadlock: PDL starts
            # this grid only once every shrink CTA is running. The output (older kernels' work) is complete: the
            # shrink passed its own wait before it let this grid start. The partial sums bypass L1 (.cg).
            while tl.atomic_add(ready_ptr + pid_b, 0, sem="acquire", scope="gpu") < SPLIT_K:
                pass
        inter = tl.load(part_ptrs, mask=mask_m[:, None], other=0.0, cache_modifier=".cg" if READY else "")
        for s in tl.static_range(1, SPLIT_K):
            inter += tl.load(
                part_ptrs + s * num_pairs * RANK_PAD,
                mask=mask_m[:, None],
                other=0.0,
                cache_modifier=".cg" if READY else "",
            )
        inter = inter.to(bt.dtype)
        w = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if MUL_ROUTED_WEIGHT:
            w = tl.load(topk_w_ptr + pair * stride_w, mask=mask_m, other=0.0).to(tl.float32)
        _store_out_tile(out_ptrs, old, tl.dot(inter, bt), w, offs_n, mask_m, N, MUL_ROUTED_WEIGHT, EVEN_N)
        # A loop, not unrolled: with num_stages > 1 Triton pipelines its B loads (cp.async into shared memory).
        for t in range(1, N_TILES):
            offs_t = offs_n + t * BLOCK_N
            bt = _load_b_tile(b_ptrs + t * BLOCK_N * stride_bn, offs_t, offs_r, N, rank, EVEN_N, EVEN_R)
            old = _load_out_tile(out_ptrs + t * BLOCK_N * stride_on, offs_t, mask_m, N, EVEN_N)
            _store_out_tile(
                out_ptrs + t * BLOCK_N * stride_on,
                old,
                tl.dot(inter, bt),
                w,
                offs_t,
                mask_m,
                N,
                MUL_ROUTED_WEIGHT,
                EVEN_N,
            )


@triton.jit
def _load_out_tile(out_ptrs, offs_n, mask_m, N, EVEN_N: tl.constexpr):
    if EVEN_N:
        old = tl.load(out_ptrs, mask=mask_m[:, None], other=0.0)
    else:
        old = tl.load(out_ptrs, mask=mask_m[:, None] & (offs_n < N)[None, :], other=0.0)
    return old


@triton.jit
def _store_out_tile(out_ptrs, old, acc, w, offs_n, mask_m, N, MUL_ROUTED_WEIGHT: tl.constexpr, EVEN_N: tl.constexpr):
    """old + acc (scaled by the rows' routed weights) back into the output rows, in their dtype."""
    if MUL_ROUTED_WEIGHT:
        acc = acc * w[:, None]
    if EVEN_N:
        tl.store(out_ptrs, (old.to(tl.float32) + acc).to(old.dtype), mask=mask_m[:, None])
    else:
        tl.store(out_ptrs, (old.to(tl.float32) + acc).to(old.dtype), mask=mask_m[:, None] & (offs_n < N)[None, :])


@dataclass
class _Plan:
    """Validated arguments of one op, shared by its two launches."""

    output: torch.Tensor
    x_rows: torch.Tensor
    per_pair: bool
    lora_a: torch.Tensor
    lora_b: torch.Tensor
    routing: MoeLoraRouting
    weights: torch.Tensor | None
    mul_routed_weight: bool
    cfg: KernelConfig
    k: int
    n: int
    rank: int
    rank_pad: int
    split_k: int
    pdl: bool
    routing_settled: bool  # an earlier op on this routing waited for it (MoeLoraRouting.begin_op)
    ready: torch.Tensor | None = None  # this op's readiness counters (grouped routing), else None
    partials: torch.Tensor | None = None


def fused_moe_lora(
    *,
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    routing: MoeLoraRouting,
    topk_weights: torch.Tensor | None = None,
    mul_routed_weight: bool = False,
    config: KernelConfig | None = None,
) -> None:
    """Add the MoE-LoRA contribution into `output`, in place; capturable in a CUDA graph (no host sync).

    output: (M, top_k, N), bf16/fp16/fp32, last dim contiguous or strided (a column slice of a wider buffer works).
    x: (M, K) — the layer input shared by the top_k slots (gate_up) — or (M, top_k, K) — one row per slot (down).
    lora_a: (max_loras, E, r, K); lora_b: (max_loras, E, N, r) — vLLM's stacked layouts; r in 1..128 (padded to a
        power of two >= 16 inside). Same dtype as x (bf16/fp16 on the GPU; fp32 works too, and is what the CPU
        interpreter tests use).
    routing: from `moe_lora_routing` on the same topk_ids / token_lora_mapping (M, top_k, E, max_loras must match).
        Ops that share a routing run on the stream it was made on: each takes the next of its readiness-counter
        slots (see `wait_per_block`).
    topk_weights: (M, top_k) float, multiplied into the contribution when mul_routed_weight (vLLM: the down op).
    Pairs whose token has adapter -1 are left untouched. Results are deterministic (no atomics on the data path).
    """
    max_loras, num_experts, rank, k = lora_a.shape
    n = lora_b.shape[2]
    m, top_k = output.shape[0], output.shape[1]
    if lora_b.shape != (max_loras, num_experts, n, rank):
        raise ValueError(
            f"lora_b must be (max_loras, E, N, r) = {(max_loras, num_experts, n, rank)}, got {tuple(lora_b.shape)}"
        )
    if output.dim() != 3 or output.shape[2] != n:
        raise ValueError(f"output must be (M, top_k, {n}), got {tuple(output.shape)}")
    if (routing.num_pairs, routing.top_k, routing.num_experts, routing.max_loras) != (
        m * top_k,
        top_k,
        num_experts,
        max_loras,
    ):
        raise ValueError("routing was built for other M, top_k, E or max_loras")
    if x.dim() == 2 and x.shape == (m, k):
        x_rows, per_pair = x, False
    elif x.dim() == 3 and x.shape == (m, top_k, k):
        x_rows, per_pair = x.reshape(m * top_k, k), True
    else:
        raise ValueError(f"x must be (M, K) = {(m, k)} or (M, top_k, K) = {(m, top_k, k)}, got {tuple(x.shape)}")
    if mul_routed_weight and (topk_weights is None or topk_weights.shape != (m, top_k)):
        raise ValueError("mul_routed_weight needs topk_weights of shape (M, top_k)")
    if rank > 128:
        raise ValueError(f"rank {rank} > 128 is not supported")
    if output.stride(0) != top_k * output.stride(1):
        raise ValueError("output's first two dims must collapse into one (stride(0) == top_k * stride(1))")
    if m == 0:
        return
    plan = _plan(
        output=output,
        x_rows=x_rows,
        per_pair=per_pair,
        lora_a=lora_a,
        lora_b=lora_b,
        routing=routing,
        topk_weights=topk_weights,
        mul_routed_weight=mul_routed_weight,
        config=config,
    )
    _run_shrink(plan)
    _run_expand(plan)


def _plan(*, output, x_rows, per_pair, lora_a, lora_b, routing, topk_weights, mul_routed_weight, config) -> _Plan:
    rank, k = lora_a.shape[2:]
    n = lora_b.shape[2]
    cfg = config or default_config(routing=routing, k=k, n=n, rank=rank, device=x_rows.device)
    top_k = routing.top_k
    weights = topk_weights
    if weights is not None and weights.stride(0) != top_k * weights.stride(1):
        weights = weights.contiguous()
    # Splits of whole K iterations, none empty: 23 iterations in 16 splits is 12 splits of two.
    k_iters = triton.cdiv(k, cfg.shrink_block_k)
    split_k = triton.cdiv(k_iters, triton.cdiv(k_iters, max(1, min(cfg.split_k, k_iters))))
    settled, ready = routing.begin_op(per_block_wait=cfg.wait_per_block)
    return _Plan(
        output=output,
        x_rows=x_rows,
        per_pair=per_pair,
        lora_a=lora_a,
        lora_b=lora_b,
        routing=routing,
        weights=weights,
        mul_routed_weight=mul_routed_weight,
        cfg=cfg,
        k=k,
        n=n,
        rank=rank,
        rank_pad=max(16, triton.next_power_of_2(rank)),
        split_k=split_k,
        pdl=use_pdl(x_rows.device) if cfg.pdl is None else cfg.pdl,
        routing_settled=settled,
        ready=ready,
    )


def early_a_fits(block_k: int, rank_pad: int, warps: int) -> bool:
    """Whether a shrink may hold its first A tile across its wait: at most 64 elements a thread. The tile roughly
    doubles the kernel's registers (sm_90: 80 -> 175 at 256 x 32 over 4 warps); past 64 elements it reached 255 and
    spilled (256 x 64 over 2 warps), in configurations where the early tile was never measured to pay."""
    return block_k * rank_pad <= 64 * 32 * warps


def _run_shrink(p: _Plan) -> None:
    r, cfg = p.routing, p.cfg
    p.partials = torch.empty((p.split_k, r.num_pairs, p.rank_pad), dtype=torch.float32, device=p.x_rows.device)
    _shrink_kernel[(r.max_blocks, p.split_k)](
        p.x_rows,
        p.lora_a,
        p.partials,
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
        num_warps=cfg.shrink_warps,
        num_stages=cfg.shrink_stages,
        **_launch_options(p.pdl, cfg.shrink_maxnreg),
    )


def _run_expand(p: _Plan) -> None:
    r, cfg = p.routing, p.cfg
    assert p.partials is not None, "shrink first"
    n_tiles = max(1, cfg.expand_tiles)
    span = cfg.expand_block_n * n_tiles
    _expand_kernel[(r.max_blocks, triton.cdiv(p.n, span))](
        p.partials,
        p.lora_b,
        p.output,
        p.weights if p.weights is not None else p.partials,
        r.sorted_pairs,
        r.block_table,
        r.num_blocks,
        r.topk_ids,
        r.token_lora,
        p.ready if p.ready is not None else r.num_blocks,
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
        num_warps=cfg.expand_warps,
        num_stages=cfg.expand_stages,
        **_launch_options(p.pdl, cfg.expand_maxnreg),
    )


def _launch_options(pdl: bool, maxnreg: int | None) -> dict:
    return ({"launch_pdl": True} if pdl else {}) | ({"maxnreg": maxnreg} if maxnreg is not None else {})
