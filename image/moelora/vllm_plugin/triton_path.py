"""The CUDA path: moelora.kernels' routing and fused op, driven from the plugin's per-call layout.

A layer calls the op twice (w13, then w2 with the routed weights) on the same routing tensors, so the routing built
for a w13 call is kept and reused by the next w2 call when it was given the very same routing tensors on the same
stream; a w13 call always rebuilds it (the allocator may hand the next layer the same addresses).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from moelora.kernels import MoeLoraRouting, default_block_m, default_config, fused_moe_lora, moe_lora_routing

from .expert_int8 import int8_weights

__all__ = ["Router", "route", "run_triton"]


class Router:
    """Builds (and for w2 reuses) the (adapter, expert) routing of one op call."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] | None = None
        self._routing: MoeLoraRouting | None = None

    def route(
        self,
        *,
        key: tuple[int, ...],
        reuse: bool,
        make_topk_ids: Callable[[], torch.Tensor],
        token_lora_mapping: torch.Tensor,
        num_experts: int,
        max_loras: int,
    ) -> MoeLoraRouting:
        dev = token_lora_mapping.device
        full_key = key + ((torch.cuda.current_stream(dev).cuda_stream,) if dev.type == "cuda" else ())
        if reuse and self._key == full_key and self._routing is not None:
            return self._routing
        routing = route(
            topk_ids=make_topk_ids(),
            token_lora_mapping=token_lora_mapping,
            num_experts=num_experts,
            max_loras=max_loras,
        )
        self._key, self._routing = full_key, routing
        return routing


def route(
    *, topk_ids: torch.Tensor, token_lora_mapping: torch.Tensor, num_experts: int, max_loras: int
) -> MoeLoraRouting:
    """moelora's routing of (M, top_k) expert ids, with the kernel's default block size.

    Grouped, not the library's `auto`, unless MOELORA_ROUTING says otherwise: `auto`'s direct routing at decode runs
    the layer alone faster but not a served model's decode step (docs/benchmarks-history.md, "vLLM end to end",
    2026-11-30)."""
    m, top_k = topk_ids.shape
    block_m = default_block_m(num_pairs=m * top_k, num_groups=num_experts * max_loras)
    return moe_lora_routing(
        topk_ids=topk_ids,
        token_lora_mapping=token_lora_mapping,
        num_experts=num_experts,
        max_loras=max_loras,
        block_m=block_m,
        method=os.environ.get("MOELORA_ROUTING", "grouped"),
    )


def run_triton(
    *,
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: tuple[torch.Tensor, ...],
    lora_b: tuple[torch.Tensor, ...],
    routing: MoeLoraRouting,
    topk_weights: torch.Tensor,
    mul_routed_weight: bool,
) -> None:
    """One op over 1 or 2 slices: output (M, top_k, slices * N) view += LoRA(x), slice s in columns [s * N,
    (s + 1) * N), with the kernel's default launch configuration for one slice's N (the table's tuned shape)."""
    a, b = lora_a[0], lora_b[0]
    config = default_config(routing=routing, k=a.shape[3], n=b.shape[2], rank=a.shape[2], device=x.device)
    lora_a, lora_b, scale = int8_weights(lora_a, lora_b)  # the layer's int8 copy where expert_int8 made one
    fused_moe_lora(
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
