"""Triton kernels for MoE-LoRA serving: the fused MoE-LoRA op, its routing step, a PyTorch reference. Needs only
torch and triton. The tuner and the benchmark live in moelora.kernels.tools, which this runtime never imports."""

from .fused import KernelConfig, default_block_m, default_config, fused_moe_lora, table_token_counts
from .reference import moe_lora_layer_reference, moe_lora_reference
from .routing import MoeLoraRouting, moe_lora_routing

__all__ = [
    "KernelConfig",
    "MoeLoraRouting",
    "default_block_m",
    "default_config",
    "fused_moe_lora",
    "moe_lora_layer_reference",
    "moe_lora_reference",
    "moe_lora_routing",
    "table_token_counts",
]
