"""Launch parameters of the fused op: KernelConfig, and the lookup of a tuned one in the bundled JSON tables
(configs/<GPU>.json) or a mounted folder, with a size-based fallback."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from moelora.api.kernel_table import KernelTable, TableEntry

from .routing import MoeLoraRouting

__all__ = ["KernelConfig", "default_block_m", "default_config", "table_token_counts"]


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
    # The one-kernel op (onepass routing, onepass.py): its K and N tiles, warps and pipeline stages, the resident
    # CTAs per SM it spreads a batch over (capped by what the compiled kernel leaves room for), and at most this many
    # CTAs per (pair, slice) (0: up to onepass.SPLIT_PAD).
    one_pass_block_k: int = 128
    one_pass_block_n: int = 256
    one_pass_warps: int = 4
    one_pass_stages: int = 2
    one_pass_ctas_per_sm: int = 4
    one_pass_max_split: int = 0


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def default_block_m(*, num_pairs: int, num_groups: int) -> int:
    """Pairs per block. 16 everywhere: more, smaller CTAs keep more loads in flight and a group's second block finds
    its weights in L2, so the tuning sweeps never picked 32 or 64 (docs/benchmarks-history.md, Kernels)."""
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
    # Enough shrink CTAs to keep every SM streaming A: ~4 per SM, near what the tuning sweeps picked.
    split_k = max(1, min(k_iters // 2, triton.cdiv(4 * sms, routing.max_blocks)))
    split_k = min(split_k, 16)
    block_n = 256 if rank <= 32 else 128
    return KernelConfig(split_k=split_k, shrink_block_k=block_k, expand_block_n=block_n)


def _config_file(device: torch.device) -> Path | None:
    """<GPU>.json from the folder the operator mounts for vLLM's own tuned files (VLLM_TUNED_CONFIG_FOLDER), so a
    ModelServer's kernel configs reach our kernel too; else the bundled one."""
    if device.type != "cuda":
        return None
    return _named_file(_device_name(device.index), os.environ.get("VLLM_TUNED_CONFIG_FOLDER"))


# Both once per process: otherwise a device query and two file checks on every op of every eager forward. The folder
# is a volume the pod mounts before vLLM starts.
@functools.lru_cache(maxsize=16)
def _device_name(index: int | None) -> str:
    return torch.cuda.get_device_name(index).replace(" ", "_").replace("-", "_")


@functools.lru_cache(maxsize=16)
def _named_file(name: str, mounted: str | None) -> Path | None:
    for folder in ([Path(mounted)] if mounted else []) + [Path(__file__).with_name("configs")]:
        if (folder / f"{name}.json").is_file():
            return folder / f"{name}.json"
    return None


@functools.lru_cache(maxsize=8)
def _load_configs(path: Path) -> tuple[TableEntry, ...]:
    """The table's entries; a malformed table raises KernelTableError naming the file and the field."""
    return KernelTable.parse(path.read_bytes(), origin=str(path)).entries


def table_token_counts(device: torch.device) -> tuple[int, ...]:
    """The token counts (M) of the config table default_config reads on this device; () without one. Each is a
    boundary where the launch configuration may change, so a warm-up that runs these compiles every variant."""
    path = _config_file(device)
    return tuple(sorted({e.m for e in _load_configs(path)})) if path is not None else ()


def _tuned_config(
    *, routing: MoeLoraRouting, k: int, n: int, rank: int, device: torch.device, config_file: Path | None = None
) -> KernelConfig | None:
    path = config_file if config_file is not None else _config_file(device)
    if path is None:
        return None
    m = max(1, routing.num_pairs // routing.top_k)
    return _nearest(path, k, n, routing.num_experts, rank, routing.max_loras, m, routing.direct)


# Called for every op of every eager forward; the table is read once per path (_load_configs), so the answer for
# one problem never changes.
@functools.lru_cache(maxsize=4096)
def _nearest(
    path: Path, k: int, n: int, num_experts: int, rank: int, max_loras: int, m: int, direct: bool
) -> KernelConfig | None:
    candidates = [e for e in _load_configs(path) if (e.k, e.n, e.num_experts) == (k, n, num_experts)]
    # Prefer entries tuned with this routing's kind (an entry tuned with direct routing says so).
    kind = "direct" if direct else "grouped"
    candidates = [e for e in candidates if e.route == kind] or candidates
    if not candidates:
        return None

    def distance(e: TableEntry) -> tuple[float, float, float]:
        return (
            abs(math.log2(e.rank / rank)),
            abs(math.log2(e.max_loras / max_loras)),
            abs(math.log2(e.m / m)),
        )

    # Only the fields the table names: KernelConfig's own defaults fill the rest.
    return KernelConfig(**min(candidates, key=distance).config.model_dump(exclude_unset=True))
