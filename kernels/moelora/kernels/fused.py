"""The fused MoE-LoRA op: output[t, k] += scale * (x_row @ A[a, e].T) @ B[a, e].T for every routed pair.

Two kernels per op, both walking the blocks of a `MoeLoraRouting`: grouped, a block is up to BLOCK_M pairs that
share one (adapter, expert), listed in the routing's block table; direct (decode sizes), a block is one pair, found
from topk_ids and the token map, and both kernels do vector math on that one row instead of a 16-row tl.dot.
- shrink (shrink.py): grid (blocks, SPLIT_K). Each CTA reduces one K-range of x_rows @ A.T into a float32 partial
  sum of shape (BLOCK_M, r), stored, not atomically added: the expand sums the SPLIT_K partials, so the op is
  deterministic and needs no zeroed buffer.
- expand (expand.py): grid (blocks, N / BLOCK_N). Each CTA sums the partials, rounds them to the weights' dtype (as
  vLLM does), multiplies by its (r, BLOCK_N) tile of B, scales by the routed weight if asked, and adds into the
  output rows in place. A CTA may take N_TILES tiles in a row: grouped, a loop Triton software-pipelines with
  num_stages > 1; direct, the next tile's load is issued before this tile's arithmetic.
The block index varies fastest in both grids and the routing lists a group's blocks next to each other, so the
blocks of one (adapter, expert) run side by side and share its A and B slices in L2. Splitting shrink from expand
reads each A slice once rather than once per N-tile CTA, as vLLM's one-shot kernel does (docs/benchmarks-history.md,
Kernels, has the measurements behind these choices).
Programmatic dependent launch (SM90+) chains routing -> shrink -> expand. With grouped routing the expand waits
only for its own block (wait_per_block): each shrink CTA adds one to its block's readiness counter (zeroed by the
routing) once its partial sums are stored, and an expand CTA, having fetched its first B tile, waits until that
counter reaches SPLIT_K. The next op on the same routing fetches its block and first A tile before its own wait,
as the routing is complete by then.

One op may carry two slices (vLLM's w13 for Qwen3-MoE: gate and up, each its own A and B): a third grid dimension
of both kernels picks the slice, so the slices share one routing and one launch of each kernel, and slice s writes
output columns [s * N, (s + 1) * N). One slice compiles to the same code as before slices existed.

At decode sizes the routing may ask for one kernel per op instead (`onepass` routing, onepass.py): direct routing's
pairs, each split over several CTAs that hand the rank intermediate to each other inside the kernel.

The experts' LoRA weights may be int8 with a scale per rank (quant.py): the shrink reads A as integers, and the
expand multiplies the intermediate by the scales before rounding it, then multiplies by B as integers.

`fused_moe_lora` runs one op; `plan_op` validates the same arguments and returns an `OpPlan` whose `shrink()` and
`expand()` launch the two kernels one at a time (the benchmark times them apart), and `run()` the whole op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton

from ._pdl import use_pdl
from .expand import launch_expand
from .launch_config import KernelConfig, default_config
from .onepass import launch_onepass
from .routing import MoeLoraRouting
from .shrink import launch_shrink

__all__ = ["OpPlan", "fused_moe_lora", "plan_op"]


@dataclass
class OpPlan:
    """Validated arguments of one op, shared by its two launches: call shrink(), then expand()."""

    output: torch.Tensor  # (M, top_k, slices * N), updated in place
    x_rows: torch.Tensor  # (M, K), or (M * top_k, K) when per_pair
    per_pair: bool
    lora_a: torch.Tensor  # (max_loras, E, rank, K), slice 0's
    lora_b: torch.Tensor  # (max_loras, E, N, rank), slice 0's
    routing: MoeLoraRouting
    weights: torch.Tensor | None  # (M, top_k) routed weights, rows collapsible into one dim
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
    slices: int = 1
    lora_a1: torch.Tensor | None = None  # slice 1's lora_a, None with one slice
    lora_b1: torch.Tensor | None = None  # slice 1's lora_b
    partials: torch.Tensor | None = None  # (slices, split_k, P, rank_pad) float32, written by shrink()
    scale: torch.Tensor | None = None  # (slices, max_loras, E, rank) float32 when A and B are int8 (quant.py)

    def run(self) -> None:
        """The whole op: one kernel when the routing asks for it (one_pass) and its CTAs fit on the GPU at once,
        else the shrink and the expand."""
        if not (self.routing.one_pass and self.scale is None and launch_onepass(self)):
            self.shrink()
            self.expand()

    def launches(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """The op as two steps, for timing them apart: (shrink, expand), or (run, nothing) for a one-pass op."""
        if self.routing.one_pass and self.scale is None:
            return self.run, lambda: None
        return self.shrink, self.expand

    def shrink(self) -> None:
        """Launch the shrink kernel: x_rows @ A.T into this plan's partial sums."""
        self.partials = launch_shrink(self)

    def expand(self) -> None:
        """Launch the expand kernel: the partial sums @ B.T added into the output. After shrink()."""
        if self.partials is None:
            raise RuntimeError("OpPlan.expand() before shrink()")
        launch_expand(self, self.partials)


def fused_moe_lora(
    *,
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor | Sequence[torch.Tensor],
    lora_b: torch.Tensor | Sequence[torch.Tensor],
    routing: MoeLoraRouting,
    topk_weights: torch.Tensor | None = None,
    mul_routed_weight: bool = False,
    config: KernelConfig | None = None,
    scale: torch.Tensor | None = None,
) -> None:
    """Add the MoE-LoRA contribution into `output`, in place; capturable in a CUDA graph (no host sync).

    output: (M, top_k, slices * N), bf16/fp16/fp32, last dim contiguous or strided (a column slice of a wider buffer
        works).
    x: (M, K) — the layer input shared by the top_k slots (gate_up) — or (M, top_k, K) — one row per slot (down).
    lora_a: (max_loras, E, r, K); lora_b: (max_loras, E, N, r) — vLLM's stacked layouts; r in 1..128 (padded to a
        power of two >= 16 inside). Same dtype as x (bf16/fp16 on the GPU; fp32 works too, and is what the CPU
        interpreter tests use).
        Or a sequence of 1 or 2 slices each (vLLM's w13 for Qwen3-MoE: gate, up), same shape, dtype and strides:
        one launch of each kernel covers both, slice s adding into output columns [s * N, (s + 1) * N).
    routing: from `moe_lora_routing` on the same topk_ids / token_lora_mapping (M, top_k, E, max_loras must match).
        Ops that share a routing run on the stream it was made on: each takes the next of its readiness-counter
        slots (see `wait_per_block`).
    topk_weights: (M, top_k) float, multiplied into the contribution when mul_routed_weight (vLLM: the down op).
    scale: with lora_a and lora_b in int8 (`quantize_expert_lora`), their scales' product per rank, (slices,
        max_loras, E, r) float32 contiguous; the intermediate is multiplied by it and rounded to the output's dtype.
        The one-pass kernel does not take it: such an op runs as shrink and expand.
    Pairs whose token has adapter -1 are left untouched. Results are deterministic (no atomics on the data path).
    """
    plan = plan_op(
        output=output,
        x=x,
        lora_a=lora_a,
        lora_b=lora_b,
        routing=routing,
        topk_weights=topk_weights,
        mul_routed_weight=mul_routed_weight,
        config=config,
        scale=scale,
    )
    if plan is not None:
        plan.run()


def plan_op(
    *,
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor | Sequence[torch.Tensor],
    lora_b: torch.Tensor | Sequence[torch.Tensor],
    routing: MoeLoraRouting,
    topk_weights: torch.Tensor | None = None,
    mul_routed_weight: bool = False,
    config: KernelConfig | None = None,
    scale: torch.Tensor | None = None,
) -> OpPlan | None:
    """Check the arguments of `fused_moe_lora` (same meaning) and plan the op without launching anything; None when
    there are no tokens. Takes the op's slot of the routing's readiness counters, like a call of the op does."""
    lora_a, lora_b, lora_a1, lora_b1 = _slices(lora_a, lora_b)
    slices = 1 if lora_a1 is None else 2
    max_loras, num_experts, rank, k = lora_a.shape
    n = lora_b.shape[2]
    m, top_k = output.shape[0], output.shape[1]
    if lora_b.shape != (max_loras, num_experts, n, rank):
        raise ValueError(
            f"lora_b must be (max_loras, E, N, r) = {(max_loras, num_experts, n, rank)}, got {tuple(lora_b.shape)}"
        )
    if output.dim() != 3 or output.shape[2] != slices * n:
        raise ValueError(f"output must be (M, top_k, {slices * n}), got {tuple(output.shape)}")
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
    _check_scale(scale, lora_a, lora_b, (slices, max_loras, num_experts, rank))
    if m == 0:
        return None
    cfg = config or default_config(routing=routing, k=k, n=n, rank=rank, device=x_rows.device)
    weights = topk_weights
    if weights is not None and weights.stride(0) != top_k * weights.stride(1):
        weights = weights.contiguous()
    # Splits of whole K iterations, none empty: 23 iterations in 16 splits is 12 splits of two.
    k_iters = triton.cdiv(k, cfg.shrink_block_k)
    split_k = triton.cdiv(k_iters, triton.cdiv(k_iters, max(1, min(cfg.split_k, k_iters))))
    settled, ready = routing.begin_op(per_block_wait=cfg.wait_per_block)
    return OpPlan(
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
        slices=slices,
        lora_a1=lora_a1,
        lora_b1=lora_b1,
        scale=scale,
    )


def _check_scale(
    scale: torch.Tensor | None, lora_a: torch.Tensor, lora_b: torch.Tensor, shape: tuple[int, ...]
) -> None:
    """int8 weights come with their scales and only with them; the kernels index the scales as contiguous."""
    if (scale is None) != (lora_a.dtype != torch.int8) or (lora_a.dtype == torch.int8) != (lora_b.dtype == torch.int8):
        raise ValueError("int8 lora_a and lora_b need a scale, and only they take one")
    if scale is not None and (tuple(scale.shape) != shape or scale.dtype != torch.float32 or not scale.is_contiguous()):
        raise ValueError(f"scale must be contiguous float32 of shape {shape}, got {tuple(scale.shape)} {scale.dtype}")


def _slices(
    lora_a: torch.Tensor | Sequence[torch.Tensor], lora_b: torch.Tensor | Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Slice 0's A and B, then slice 1's (None, None with one slice), checked alike: the kernels index both slices
    with slice 0's strides."""
    a_list = [lora_a] if isinstance(lora_a, torch.Tensor) else list(lora_a)
    b_list = [lora_b] if isinstance(lora_b, torch.Tensor) else list(lora_b)
    if len(a_list) != len(b_list) or len(a_list) not in (1, 2):
        raise ValueError(f"lora_a and lora_b must be 1 or 2 slices each, got {len(a_list)} and {len(b_list)}")
    if len(a_list) == 1:
        return a_list[0], b_list[0], None, None
    for first, second in (a_list, b_list):
        if (second.shape, second.dtype, second.stride(), second.device) != (
            first.shape,
            first.dtype,
            first.stride(),
            first.device,
        ):
            raise ValueError("the slices of lora_a (and of lora_b) must share shape, dtype, strides and device")
    return a_list[0], b_list[0], a_list[1], b_list[1]
