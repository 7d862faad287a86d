"""Triton kernels for MoE-LoRA serving. Needs only torch and triton.

routing (pairs grouped by adapter and expert), fused (the op: plan_op, fused_moe_lora), shrink and expand (its two
kernels, each with its launcher), tiles (their shared jit helpers), launch_config (KernelConfig and the tuned tables
in configs/), block_layout (vLLM's blocked routing back to topk_ids), reference (PyTorch),
dense_splitk (a dense layer's LoRA in one launch: the plugin serves it for vLLM's add_lora_linear at small token
counts). The tuner and the benchmark live in moelora.kernels.tools, which this runtime never imports."""

from .block_layout import topk_ids_from_blocks
from .fused import OpPlan, fused_moe_lora, plan_op
from .launch_config import KernelConfig, default_block_m, default_config, table_token_counts
from .quant import dequantize_expert_lora, quantize_expert_lora
from .reference import moe_lora_layer_reference, moe_lora_reference
from .routing import MoeLoraRouting, moe_lora_routing, routing_switches

__all__ = [
    "KernelConfig",
    "MoeLoraRouting",
    "OpPlan",
    "default_block_m",
    "default_config",
    "dequantize_expert_lora",
    "fused_moe_lora",
    "moe_lora_layer_reference",
    "moe_lora_reference",
    "moe_lora_routing",
    "plan_op",
    "quantize_expert_lora",
    "routing_switches",
    "table_token_counts",
    "topk_ids_from_blocks",
]
