"""What the op tests share: a case's routing, one op run on a copy of its output, and the error of its LoRA
contribution against the float64 reference.

A case is a dict of fused_moe_lora's and moe_lora_reference's inputs: x, lora_a, lora_b (one tensor each, or a
tuple of two slices), topk_ids, token_lora_mapping, topk_weights and output.
"""

from __future__ import annotations

from typing import Any

import torch

from moelora.kernels import KernelConfig, MoeLoraRouting, fused_moe_lora, moe_lora_reference, moe_lora_routing

TOL = {torch.float32: 1e-5, torch.float16: 4e-3}


def routing_of(case: dict[str, Any], *, method: str = "auto", block_m: int = 16) -> MoeLoraRouting:
    """The routing of the case's pairs, sized by (slice 0's) lora_a, (max_loras, E, rank, K)."""
    a = case["lora_a"][0] if isinstance(case["lora_a"], tuple) else case["lora_a"]
    return moe_lora_routing(
        topk_ids=case["topk_ids"],
        token_lora_mapping=case["token_lora_mapping"],
        num_experts=a.shape[1],
        max_loras=a.shape[0],
        block_m=block_m,
        method=method,
    )


def run_op(
    case: dict[str, Any],
    *,
    routing: MoeLoraRouting | None = None,
    config: KernelConfig | None = None,
    mul_routed_weight: bool = False,
    method: str = "auto",
    block_m: int = 16,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The op's result on a copy of the case's output, on `routing` (several ops share one) or a new one; `scale`
    with int8 weights in the case."""
    out = case["output"].clone()
    fused_moe_lora(
        output=out,
        x=case["x"],
        lora_a=case["lora_a"],
        lora_b=case["lora_b"],
        routing=routing if routing is not None else routing_of(case, method=method, block_m=block_m),
        topk_weights=case["topk_weights"],
        mul_routed_weight=mul_routed_weight,
        config=config,
        scale=scale,
    )
    return out


def delta_error(case: dict[str, Any], out: torch.Tensor, mul_routed_weight: bool = False) -> float:
    """Error of the LoRA contribution alone (out - base against ref - base): a missing or doubled one fails."""
    ref = moe_lora_reference(mul_routed_weight=mul_routed_weight, **case)
    base = case["output"].double()
    return ((out.double() - ref).norm() / (ref - base).norm()).item()
