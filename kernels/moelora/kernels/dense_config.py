"""What a dense layer's LoRA launches as `dense_splitk` (dense_splitk.py) runs it: the layer's weight tables
(`dense_layout`), the launch parameters served per token count (`served_config`, from the H200 sweep) and the grid's
arithmetic (`splitk_grid`, `splitk_programs`). Host-side: no kernel here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import triton

__all__ = [
    "MAX_SERVED_M",
    "SERVED",
    "DenseLayout",
    "SplitKConfig",
    "config_text",
    "dense_layout",
    "layout_fits",
    "parse_served",
    "served_config",
    "served_configs",
    "served_kwargs",
    "served_text",
    "splitk_grid",
    "splitk_programs",
]


@dataclass(frozen=True)
class DenseLayout:
    """One layer's LoRA weights as the kernel reads them: device tables made once per layer (a CUDA graph cannot
    capture their copies to the device)."""

    a_ptrs: torch.Tensor  # (S,) int64
    b_ptrs: torch.Tensor  # (S,) int64
    slice_n: torch.Tensor  # (S,) int32
    columns: torch.Tensor  # (S,) int32
    b_lora_strides: torch.Tensor  # (S,) int64
    rank: int
    k: int
    stride_al: int
    stride_ar: int
    stride_bn: int
    widths: tuple[int, ...]  # each slice's N

    @property
    def widest(self) -> int:
        return max(self.widths)


def layout_fits(lora_a: Sequence[torch.Tensor], lora_b: Sequence[torch.Tensor], widths: Sequence[int]) -> bool:
    """The weights are as `dense_layout` needs them: vLLM's stacked lora_a (max_loras, 1, rank, K) alike across slices
    and lora_b (max_loras, 1, N_s, rank) of each slice's width, last dimensions contiguous."""
    a0 = lora_a[0]
    if a0.ndim != 4 or any(a.shape != a0.shape or a.stride() != a0.stride() or a.stride(-1) != 1 for a in lora_a):
        return False
    rank = a0.shape[-2]
    return all(
        b.ndim == 4 and b.shape[-1] == rank and b.shape[-2] == n and b.stride(-1) == 1
        for b, n in zip(lora_b, widths, strict=True)
    )


def dense_layout(lora_a: Sequence[torch.Tensor], lora_b: Sequence[torch.Tensor]) -> DenseLayout:
    """lora_a (max_loras, [1,] rank, K) and lora_b (max_loras, [1,] N_s, rank) per slice, the last dimension
    contiguous, every slice's lora_a with the same strides (vLLM's stacked weights are). Copies to the device: not
    inside CUDA-graph capture."""
    rank, k = lora_a[0].shape[-2:]
    widths = [b.shape[-2] for b in lora_b]
    device = lora_a[0].device

    def table(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return DenseLayout(
        a_ptrs=table([a.data_ptr() for a in lora_a], torch.int64),
        b_ptrs=table([b.data_ptr() for b in lora_b], torch.int64),
        slice_n=table(widths, torch.int32),
        columns=table([sum(widths[:i]) for i in range(len(widths))], torch.int32),
        b_lora_strides=table([b.stride(0) for b in lora_b], torch.int64),
        rank=rank,
        k=k,
        stride_al=lora_a[0].stride(0),
        stride_ar=lora_a[0].stride(-2),
        stride_bn=lora_b[0].stride(-2),
        widths=tuple(widths),
    )


@dataclass(frozen=True)
class SplitKConfig:
    """Launch parameters: up to `split_k` shrink programs of `block_k` columns of K per unit, `n_chunks` expand
    programs per unit over tiles of `block_n` output columns."""

    split_k: int = 8
    block_k: int = 128
    n_chunks: int = 8
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


# The largest token count served: the largest measured. On an H200 (docs/benchmarks.md, "split K", rank 32, 8
# adapters; benchmarks/vllm_e2e/results/2026-12-04-dense-splitk/run2) split K against vLLM's two launches, written
# output (the served dual-stream side) / added, µs: GPT-OSS q/k/v M = 16 10.4 / 11.2 vs 15.7 / 15.1, M = 64 12.8 /
# 14.4 vs 18.2 / 17.6; o M = 16 7.0 / 7.6 vs 8.1 / 7.4, M = 64 7.7 / 8.3 vs 9.0 / 8.3; Qwen3 faster or equal at both.
# At M = 1 it is slower (q/k/v 8.7 / 9.5 vs 8.4 / 7.8): vLLM keeps M = 1. Above 64, not measured: vLLM keeps those.
MAX_SERVED_M = 64
# The best config of bench_dense's sweep per (q/k/v-like: several slices, or one slice) and M class, same run.
_SEVERAL_SLICES = ((16, SplitKConfig(split_k=8, block_k=64, n_chunks=16)), (64, SplitKConfig(8, 64, 8)))
_ONE_SLICE = ((16, SplitKConfig(split_k=16, block_k=128, n_chunks=16)), (64, SplitKConfig(32, 64, 16)))


# A table: (largest M, config) pairs, M ascending, for calls of several slices (q/k/v) and of one slice (o).
Served = dict[str, tuple[tuple[int, SplitKConfig], ...]]
SERVED: Served = {"several": _SEVERAL_SLICES, "one": _ONE_SLICE}
_FIELDS = ("split_k", "block_k", "n_chunks", "num_warps")


def parse_served(text: str) -> Served:
    """SERVED with kinds replaced as `text` says, e.g. `several=16:4/128/4,64:8/64/8;one=64:8/128/8/2`: per kind,
    its largest M and split_k/block_k/n_chunks[/num_warps] for each M class. ValueError saying what is wrong."""
    served = dict(SERVED)
    for part in filter(None, text.replace(" ", "").split(";")):
        kind, _, classes = part.partition("=")
        if kind not in SERVED:
            raise ValueError(f"{part!r}: the kind is 'several' or 'one'")
        table = []
        for item in classes.split(","):
            bound, _, values = item.partition(":")
            try:
                numbers = [int(bound), *(int(v) for v in values.split("/"))]
            except ValueError:
                raise ValueError(f"{item!r}: M:split_k/block_k/n_chunks[/num_warps], whole numbers") from None
            if not 4 <= len(numbers) <= 5 or min(numbers) < 1:
                raise ValueError(f"{item!r}: M:split_k/block_k/n_chunks[/num_warps], each at least 1")
            m, *fields = numbers
            config = SplitKConfig(**dict(zip(_FIELDS, fields, strict=False)))
            if config.block_k < 16 or config.block_k & (config.block_k - 1) or config.num_warps not in (1, 2, 4, 8):
                raise ValueError(f"{item!r}: block_k is a power of two from 16, num_warps 1, 2, 4 or 8")
            table.append((m, config))
        bounds = [m for m, _ in table]
        if bounds != sorted(set(bounds)) or not 2 <= bounds[0] or bounds[-1] > MAX_SERVED_M:
            raise ValueError(f"{part!r}: the M bounds rise, from 2 to at most {MAX_SERVED_M}")
        served[kind] = tuple(table)
    return served


def config_text(config: SplitKConfig) -> str:
    """A config as parse_served reads it: split_k/block_k/n_chunks/num_warps."""
    return f"{config.split_k}/{config.block_k}/{config.n_chunks}/{config.num_warps}"


def served_text(served: Served) -> str:
    """The kinds of a table as parse_served reads them."""
    return ";".join(f"{kind}=" + ",".join(f"{m}:{config_text(c)}" for m, c in table) for kind, table in served.items())


def served_config(m: int, slices: int, served: Served = SERVED) -> SplitKConfig | None:
    """The launch parameters for M tokens and this many slices, or None where vLLM's own launches are faster or
    not measured against (M = 1, M > MAX_SERVED_M, or past the table's largest M)."""
    if not 2 <= m <= MAX_SERVED_M:
        return None
    for bound, config in served["several" if slices > 1 else "one"]:
        if m <= bound:
            return config
    return None


def served_configs(slices: int, served: Served = SERVED) -> tuple[SplitKConfig, ...]:
    """Every config `served_config` can pick for this many slices, with the largest M it is picked for."""
    return tuple(config for _, config in served["several" if slices > 1 else "one"])


def splitk_grid(*, k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(S, K tiles per shrink program): at most `split_k` programs, each at least one K tile."""
    tiles = triton.cdiv(k, block_k)
    per = triton.cdiv(tiles, max(1, min(split_k, tiles)))
    return triton.cdiv(tiles, per), per


def splitk_programs(*, m: int, groups: int, slices: int, k: int, config: SplitKConfig) -> tuple[int, int]:
    """(programs, units) of the grid for M tokens in `groups` adapter groups: units = slices x row blocks, each
    with S shrink and `n_chunks` expand programs."""
    n_split, _ = splitk_grid(k=k, block_k=config.block_k, split_k=config.split_k)
    # Each group's rows fill cdiv(count, 16) blocks: at most groups * cdiv(M, 16), and at most groups + M // 16.
    row_blocks = min(groups * triton.cdiv(m, 16), groups + m // 16)
    units = slices * row_blocks
    return (n_split + config.n_chunks) * units, units


def served_kwargs(config: SplitKConfig) -> dict[str, int]:
    """dense_splitk's keyword arguments for a config."""
    return asdict(config)
