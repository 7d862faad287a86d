"""How many CTAs of a kernel the GPU holds at once, and the per-device counters of kernels whose CTAs wait for
each other (onepass.py): such a grid must be resident whole, or its waiting CTAs never see their siblings."""

from __future__ import annotations

import torch
import triton

# Most CTAs per (pair, slice): the expand reads all S partials as one (SPLIT_PAD, RANK_PAD) tile, so S has a
# compile-time bound that does not follow the token count.
SPLIT_PAD = 32


def onepass_split(*, units: int, room: int, k: int, n: int, block_k: int, block_n: int) -> tuple[int, int, int]:
    """(S, K tiles per CTA, N tiles per CTA) for `units` (pair, slice) rows of CTAs in `room` resident CTAs: S as
    large as the room, SPLIT_PAD and K's tiles allow, every CTA at least one K tile. S = 0 when units > room."""
    if units > room:
        return 0, 0, 0
    k_tiles = triton.cdiv(k, block_k)
    want = max(1, min(SPLIT_PAD, room // units, k_tiles))
    k_span_tiles = triton.cdiv(k_tiles, want)
    split = triton.cdiv(k_tiles, k_span_tiles)
    n_tiles = triton.cdiv(n, block_n)
    n_span_tiles = triton.cdiv(n_tiles, min(split, n_tiles))
    return split, k_span_tiles, n_span_tiles


_counters: dict[torch.device, torch.Tensor] = {}


def counter_buffer(device: torch.device, size: int) -> torch.Tensor | None:
    """The zeroed counters of this device, made at the first call outside CUDA-graph capture (a buffer made during
    capture would be zeroed only when that graph replays); None before then. Never reallocated on the GPU (captured
    graphs keep its address): sized for two words per CTA the GPU can hold."""
    buf = _counters.get(device)
    if buf is None or buf.numel() < size:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = torch.zeros(max(size, 1), dtype=torch.int32, device=device)
        _counters[device] = buf
    return buf


def resident_room(device_index: int, n_regs: int, shared: int, warps: int) -> int:
    """CTAs of a kernel with these resources that the whole GPU holds at once."""
    props = triton.runtime.driver.active.utils.get_device_properties(device_index)
    # Registers are allocated per warp in units of 256.
    regs_per_cta = warps * triton.cdiv(max(n_regs, 1) * 32, 256) * 256
    per_sm = min(props["max_num_regs"] // regs_per_cta, 2048 // (32 * warps), 32)
    if shared:
        per_sm = min(per_sm, props["max_shared_mem"] // (shared + 1024))
    return max(1, per_sm) * props["multiprocessor_count"]


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
