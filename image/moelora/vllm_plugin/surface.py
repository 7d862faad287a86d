"""vLLM's serving surface that moelora relies on: the server's entry module and middleware hook (the admin guard),
the runtime LoRA API (the agent), and the environment, flags, tuned-config file names and metrics (the operator).
Part of the touchpoint list (touchpoints.py explains the kinds); stdlib only.
"""

from __future__ import annotations

from .contract import Touchpoint

__all__ = ["SURFACE"]

_LORA_UTILS = "lora/ops/triton_ops/utils.py"
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
# The flags operator.engine renders itself (besides --middleware and --load-format, listed with their users).
_RENDERED_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--enable-lora",
    "--max-loras",
    "--max-lora-rank",
    "--max-cpu-loras",
    "--fully-sharded-loras",
    "--tensor-parallel-size",
    "--shutdown-timeout",
)


def _flag(flag: str, used_by: str) -> Touchpoint:
    return Touchpoint(f"flag {flag}", "flag", _CLI_ARGS, flag, used_by=used_by)


def _env(name: str, used_by: str) -> Touchpoint:
    return Touchpoint(f"env {name}", "env", _ENVS, name, used_by=used_by)


SURFACE: tuple[Touchpoint, ...] = (
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
        "local.vllm_flags (generates operator/render/vllm_flags.txt)",
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
        "POST /v1/completions",
        "route",
        ("entrypoints/openai/completion/api_router.py",),
        "/v1/completions",
        ("post",),
        "agent.vllm (the output check), probes",
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
        "GET /metrics",
        "text",
        ("entrypoints/serve/instrumentator/metrics.py",),
        "/metrics (a mounted Prometheus app, not a decorated route)",
        ('Mount("/metrics"',),
        "agent.usage (placement's load samples)",
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
    # ---- the resolver: vLLM asks registered LoRA resolvers for a model name it does not serve ----
    Touchpoint(
        "LoRAResolver.resolve_lora",
        "params",
        ("lora/resolver.py",),
        "LoRAResolver.resolve_lora",
        ("self", "base_model_name", "lora_name"),
        "vllm_plugin.resolver",
    ),
    Touchpoint(
        "LoRAResolverRegistry.register_resolver",
        "params",
        ("lora/resolver.py",),
        "_LoRAResolverRegistry.register_resolver",
        ("self", "resolver_name", "resolver"),
        "vllm_plugin.resolver",
    ),
    Touchpoint(
        "the resolver registry instance",
        "text",
        ("lora/resolver.py",),
        "LoRAResolverRegistry, one per process",
        ("LoRAResolverRegistry = _LoRAResolverRegistry()", "def get_supported_resolvers(self)"),
        "vllm_plugin.resolver",
    ),
    Touchpoint(
        "LoRARequest fields",
        "fields",
        ("lora/request.py",),
        "LoRARequest",
        ("lora_name", "lora_int_id", "lora_path"),
        "vllm_plugin.resolver",
    ),
    Touchpoint(
        "unknown adapter names go to the resolvers",
        "text",
        ("entrypoints/openai/models/serving.py",),
        "OpenAIServingModels: every registered resolver asked, its LoRARequest registered",
        (
            "LoRAResolverRegistry.get_supported_resolvers()",
            "await resolver.resolve_lora(base_model_name, lora_name)",
            "lora_request.lora_int_id = unique_id",
            "await self.engine_client.add_lora(lora_request)",
        ),
        "vllm_plugin.resolver",
    ),
    Touchpoint(
        "requests resolve unknown models",
        "text",
        ("entrypoints/serve/engine/serving.py",),
        "_check_model asks resolve_lora with runtime LoRA updating on",
        ("envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING", "await self.models.resolve_lora(request.model)"),
        "vllm_plugin.resolver",
    ),
    Touchpoint(
        "HTTPException handler is registered",
        "text",
        ("entrypoints/openai/api_server.py", "entrypoints/serve/exception_handling/register.py"),
        "an HTTPException raised while serving becomes its status",
        ("app.exception_handler(HTTPException)(http_exception_handler)",),
        "vllm_plugin.resolver (its refusals)",
    ),
    Touchpoint(
        "HTTPException handler answers status and detail",
        "text",
        ("entrypoints/serve/utils/server_utils.py", "entrypoints/serve/exception_handling/handlers/http.py"),
        "the response carries exc.status_code and exc.detail",
        ("sanitize_message(exc.detail)", "code=exc.status_code"),
        "vllm_plugin.resolver (its refusals)",
    ),
    # ---- the operator: environment, flags, tuned configs, metrics ----
    _env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "operator.engine (the agent's routes and the resolver need it)"),
    _env("VLLM_TUNED_CONFIG_FOLDER", "operator.engine, operator.kernel_configs"),
    _env("VLLM_API_KEY", "operator.engine (refused in env)"),
    _env("VLLM_LORA_RESOLVER_CACHE_DIR", "operator.engine (refused in env: vLLM's filesystem resolver)"),
    _env("VLLM_LORA_RESOLVER_HF_REPO_LIST", "operator.engine (refused in env: vLLM's Hugging Face resolver)"),
    *(_env(name, "operator.engine") for name in ("VLLM_NO_USAGE_STATS", "VLLM_LORA_ENABLE_DUAL_STREAM")),
    *(_flag(flag, "operator.engine") for flag in _RENDERED_FLAGS),
    _flag("--middleware", "operator.engine (admin_guard)"),
    _flag("--load-format", "operator.engine (model.loadFormat: streamer)"),
    _flag("--lora-target-modules", "operator.engine (lora.targetModules)"),
    Touchpoint(
        "--lora-target-modules matches module suffixes",
        "text",
        ("lora/utils.py",),
        "is_in_target_modules: a wrapped module's last name, or its packed children (q_proj for qkv_proj)",
        ('module_suffix = module_name.split(".")[-1]', "packed_children = packed_modules_mapping.get(module_suffix)"),
        "operator.engine (adds `experts` for expert projections)",
    ),
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
