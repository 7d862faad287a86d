"""vLLM's command line and environment for a ModelServer: pure functions of the spec.

Flags moelora sets itself (the model, the port, the LoRA limits...) are refused in `engineArgs`, so a user cannot
silently fight the operator; flags vLLM does not know are refused too, before a pod crash-loops on them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re
from typing import Any

from moelora.api import ExpertLoraWeights, KernelImplementation, LoadFormat, ModelServerSpec
from moelora.api.agent_env import ADAPTER_CACHE_DIR, ADMIN_KEY_FILE, VLLM_PORT, AgentEnv
from moelora.operator.errors import SpecProblem
from moelora.operator.render import engine_flags
from moelora.operator.settings import DEFAULT_DRAIN_DELAY_SECONDS

MODELS_DIR = "/models"
KERNEL_CONFIGS_DIR = "/etc/moelora/kernel-configs"
# spec.kernels.compileCache: the image's directory of the claim. vLLM keeps torch.compile's artifacts under its cache
# root and points Triton there once it compiles; Triton's own variable covers kernels built before that.
COMPILE_CACHE_DIR = "/var/cache/moelora/compile"
COMPILE_CACHE_ENV = {"VLLM_CACHE_ROOT": f"{COMPILE_CACHE_DIR}/vllm", "TRITON_CACHE_DIR": f"{COMPILE_CACHE_DIR}/triton"}
# spec.kernels.expertLoraWeights int8: the plugin's variable asking it to keep the experts' LoRA weights in int8.
EXPERT_LORA_WEIGHTS_ENV = "MOELORA_EXPERT_LORA_WEIGHTS"
# The per-pod key the agent writes and vLLM's admin guard reads: an in-memory volume only the two containers mount.
ADMIN_KEY_DIR = str(pathlib.PurePosixPath(ADMIN_KEY_FILE).parent)
ADMIN_KEY_FILE_ENV = AgentEnv.variable("admin_key_file")
# The server image's ASGI middleware that keeps vLLM's admin routes (adapter load/unload...) to the agent.
ADMIN_GUARD = "moelora.vllm_plugin.admin_guard.AdminGuard"

# Flags whose value comes from the spec (or whose job is done by LoRAAdapter objects): the user sets those fields.
MANAGED_FLAGS = frozenset(
    {
        "--model",
        "--served-model-name",
        "--host",
        "--port",
        "--enable-lora",
        "--no-enable-lora",
        "--max-loras",
        "--max-lora-rank",
        "--max-cpu-loras",
        "--fully-sharded-loras",
        "--no-fully-sharded-loras",
        "--tensor-parallel-size",
        "-tp",
        "--lora-modules",
        "--lora-target-modules",
        "--api-key",
    }
)
# vLLM's own LoRA resolvers (general plugins in its wheel) register adapters from a directory or the Hugging Face hub
# that none of the agent's checks have seen; moelora's resolver, which asks the agent, is the only one a pod may have.
VLLM_RESOLVER_ENV = frozenset({"VLLM_LORA_RESOLVER_CACHE_DIR", "VLLM_LORA_RESOLVER_HF_REPO_LIST"})
# Where a refused flag or variable is set instead, when that is not simply "the spec".
_INSTEAD = {
    **dict.fromkeys(
        VLLM_RESOLVER_ENV, "vLLM's own resolver would serve adapters no check has seen; create LoRAAdapters instead"
    ),
    **dict.fromkeys(COMPILE_CACHE_ENV, "spec.kernels.compileCache sets it"),
    EXPERT_LORA_WEIGHTS_ENV: "set spec.kernels.expertLoraWeights",
    "--api-key": "set spec.apiKeySecret, which the adapter agent also uses",
    "--lora-target-modules": "set spec.lora.targetModules, which the adapter agent also holds adapters to",
    "VLLM_API_KEY": "set spec.apiKeySecret, which the adapter agent also uses",
}
# The plugin's variable naming the directory whose adapters it reads ahead (its host_adapters part).
AHEAD_ENV = "MOELORA_ADAPTERS_AHEAD_DIR"
# Environment the operator sets on the vLLM container; a user's env entry of the same name is refused.
MANAGED_ENV = frozenset(
    {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "VLLM_NO_USAGE_STATS",
        "VLLM_TUNED_CONFIG_FOLDER",
        "MOELORA_KERNEL",
        "VLLM_LORA_ENABLE_DUAL_STREAM",
        AHEAD_ENV,
        EXPERT_LORA_WEIGHTS_ENV,
        "VLLM_API_KEY",
        ADMIN_KEY_FILE_ENV,
        "HOME",  # a writable emptyDir under a read-only root filesystem (security.py)
    }
)
# The pod's terminationGracePeriodSeconds (deployment.py renders it): how long a rollout lets generations finish.
TERMINATION_GRACE_SECONDS = 120
# vLLM aborts running requests on SIGTERM unless told how long to drain them (shutdown_timeout_seconds).
SHUTDOWN_TIMEOUT_FLAG = "--shutdown-timeout"
# What vLLM needs after its drain to tear its engine down and exit before the kubelet's SIGKILL.
EXIT_MARGIN_SECONDS = 10
# vLLM's loader that streams safetensors from object storage (model.loadFormat: streamer).
LOAD_FORMAT_FLAG = "--load-format"
STREAMER_LOAD_FORMAT = "runai_streamer"
# PEFT's names of an expert's projections, per expert or as transformers' fused 3-D experts. vLLM wraps a MoE layer's
# experts as one module, `experts`, which its --lora-target-modules selects by that name only (no packed mapping).
EXPERT_PROJECTIONS = frozenset({"gate_proj", "up_proj", "down_proj", "gate_up_proj"})
VLLM_EXPERTS_MODULE = "experts"
# The Hugging Face hub's token variable; managed only when spec.model.tokenSecret is set.
TOKEN_ENV = "HF_TOKEN"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRef:
    """Where the weights come from and what vLLM's --model becomes."""

    scheme: str  # hf | s3 | pvc
    vllm_model: str  # the --model argument
    uri: str | None = None  # what a fetch downloads: the s3:// URI, or the hub repo id
    claim: str | None = None  # the PersistentVolumeClaim for pvc://
    sub_path: str = ""  # the path inside the claim


def model_ref(spec: ModelServerSpec) -> ModelRef:
    source = spec.model.source or f"hf://{spec.model.name}"
    scheme, _, rest = source.partition("://")
    if scheme == "hf":
        # With a shared cache the weights are on the claim mounted at MODELS_DIR (model_cache.py).
        return ModelRef(scheme="hf", vllm_model=MODELS_DIR if spec.model.cache else rest, uri=rest)
    if scheme == "s3":
        streamed = spec.model.load_format == LoadFormat.STREAMER  # vLLM reads the s3:// URI itself
        return ModelRef(scheme="s3", vllm_model=source if streamed else MODELS_DIR, uri=source)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        path = path.strip("/")
        return ModelRef(
            scheme="pvc", vllm_model=f"{MODELS_DIR}/{path}" if path else MODELS_DIR, claim=claim, sub_path=path
        )
    raise SpecProblem("InvalidModelSource", f"unsupported model source {source!r}")  # the schema forbids it


def flag_name(token: str) -> str:
    """`--max_model_len=8` -> `--max-model-len`; `--compilation-config.mode` -> `--compilation-config`."""
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


_NEGATIVE_NUMBER = re.compile(r"^-\d")


def _is_value(token: str) -> bool:
    return not token.startswith("-") or bool(_NEGATIVE_NUMBER.match(token))


def check_engine_args(engine_args: list[str]) -> None:
    """Raise SpecProblem for a flag moelora manages (ManagedEngineFlag), one vLLM does not know
    (UnknownEngineFlag), or values that do not fit the flag (EngineArgValue): vLLM would exit on any of them."""
    arity = engine_flags.flag_arity()
    index = 0
    while index < len(engine_args):
        token = engine_args[index]
        if _is_value(token):
            raise SpecProblem(
                "EngineArgValue",
                f"engineArgs has the value {token!r} where a flag should be (the model comes from spec.model)",
            )
        name = flag_name(token)
        if name in MANAGED_FLAGS:
            instead = _INSTEAD.get(name, "moelora sets it from the ModelServer spec")
            raise SpecProblem("ManagedEngineFlag", f"engineArgs may not set {name}: {instead}")
        if name not in arity:
            raise SpecProblem("UnknownEngineFlag", f"engineArgs has {name}, which vLLM does not know")
        index += 1
        inline = "=" in token
        values = 0
        while index < len(engine_args) and _is_value(engine_args[index]):
            values += 1
            index += 1
        dotted = token.split("=", 1)[0] != name and "." in token.split("=", 1)[0]  # --json-arg.key value
        if arity[name] == engine_flags.NONE and (inline or values):
            raise SpecProblem("EngineArgValue", f"engineArgs: {name} is a switch and takes no value")
        if arity[name] == engine_flags.ONE and not dotted and inline + values != 1:
            raise SpecProblem("EngineArgValue", f"engineArgs: {name} takes exactly one value")


def compile_cache_path(image: str) -> str:
    """The claim's directory for one server image: what one build of vLLM and moelora compiled stays apart."""
    return "image-" + hashlib.sha256(image.encode()).hexdigest()[:16]


def check_env(spec: ModelServerSpec) -> None:
    managed = MANAGED_ENV | VLLM_RESOLVER_ENV | ({TOKEN_ENV} if spec.model.token_secret else set())
    managed |= set(COMPILE_CACHE_ENV) if spec.kernels.compile_cache else set()
    for var in spec.env:
        if var.name in managed:
            instead = _INSTEAD.get(var.name, "moelora sets it from the spec")
            raise SpecProblem("ManagedEnvVar", f"env may not set {var.name}: {instead}")


def api_key_source(spec: ModelServerSpec) -> dict[str, Any]:
    """The client API key's secretKeyRef (spec.apiKeySecret must be set)."""
    assert spec.api_key_secret is not None
    return {"secretKeyRef": {"name": spec.api_key_secret.name, "key": spec.api_key_secret.key}}


def required_secrets(spec: ModelServerSpec) -> list[tuple[str, str]]:
    """(Secret name, what needs it) for every Secret the pod cannot start without; optional references left out."""
    needed: list[tuple[str, str]] = []
    if spec.s3.credentials_secret is not None:
        needed.append((spec.s3.credentials_secret.name, "S3 credentials"))
    if spec.model.token_secret is not None:
        needed.append((spec.model.token_secret.name, "Hugging Face token (spec.model.tokenSecret)"))
    if spec.api_key_secret is not None:
        needed.append((spec.api_key_secret.name, "client API key (spec.apiKeySecret)"))
    for var in spec.env:
        ref = var.value_from.secret_key_ref if var.value_from else None
        if ref is not None and not ref.optional:
            needed.append((ref.name, f"env {var.name}"))
    for index, source in enumerate(spec.env_from):
        if source.secret_ref is not None and not source.secret_ref.optional:
            needed.append((source.secret_ref.name, f"envFrom[{index}]"))
    return needed


def required_claims(spec: ModelServerSpec) -> list[tuple[str, str]]:
    """(PersistentVolumeClaim name, what needs it) for every claim of the user's the pod mounts."""
    needed: list[tuple[str, str]] = []
    model = model_ref(spec)
    if model.scheme == "pvc" and model.claim is not None:
        needed.append((model.claim, "model.source"))
    if spec.kernels.compile_cache is not None:
        needed.append((spec.kernels.compile_cache.claim_name, "kernels.compileCache"))
    return needed


def token_env(spec: ModelServerSpec) -> list[dict[str, Any]]:
    """HF_TOKEN from spec.model.tokenSecret, only ever as a secretKeyRef."""
    token = spec.model.token_secret
    if token is None:
        return []
    return [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}}]


def user_env(spec: ModelServerSpec) -> list[dict[str, Any]]:
    """spec.env as Kubernetes EnvVars: a literal value, or the valueFrom reference as given."""
    env: list[dict[str, Any]] = []
    for var in spec.env:
        if var.value_from is not None:
            env.append({"name": var.name, "valueFrom": var.value_from.to_wire()})
        elif var.value:
            env.append({"name": var.name, "value": var.value})
        else:  # defined and empty: the API server stores an empty value this way
            env.append({"name": var.name})
    return env


def vllm_env_from(spec: ModelServerSpec) -> list[dict[str, Any]]:
    """spec.envFrom as given; Kubernetes lets every variable in env win over these."""
    return [source.to_wire() for source in spec.env_from]


def served_model_name(spec: ModelServerSpec, *, name: str) -> str:
    return spec.model.served_name or name


def vllm_args(spec: ModelServerSpec, *, name: str, drain_delay: int = DEFAULT_DRAIN_DELAY_SECONDS) -> list[str]:
    """The vLLM OpenAI server's arguments; `drain_delay`: the pod's preStop delay (Settings.drain_delay_seconds).
    Checks engineArgs first (raises SpecProblem)."""
    check_engine_args(spec.engine_args)
    lora = spec.lora
    args = [
        "--model",
        model_ref(spec).vllm_model,
        "--served-model-name",
        served_model_name(spec, name=name),
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--enable-lora",
        "--max-loras",
        str(lora.max_loras),
        "--max-lora-rank",
        str(lora.max_lora_rank),
        "--middleware",
        ADMIN_GUARD,
    ]
    if lora.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(lora.max_cpu_loras)]
    if lora.fully_sharded:
        args.append("--fully-sharded-loras")
    if lora.target_modules:
        args += ["--lora-target-modules", *lora_target_modules(lora.target_modules)]
    if spec.gpus > 1:
        args += ["--tensor-parallel-size", str(spec.gpus)]
    if spec.model.load_format == LoadFormat.STREAMER:
        if any(flag_name(token) == LOAD_FORMAT_FLAG for token in spec.engine_args):
            raise SpecProblem(
                "ManagedEngineFlag", f"engineArgs may not set {LOAD_FORMAT_FLAG}: model.loadFormat sets it"
            )
        args += [LOAD_FORMAT_FLAG, STREAMER_LOAD_FORMAT]
    return args + shutdown_timeout(spec.engine_args, drain_delay=drain_delay) + list(spec.engine_args)


def shutdown_timeout_seconds(drain_delay: int) -> int:
    """How long vLLM may drain after SIGTERM: the pod's grace period less the preStop hook's delay, which the kubelet
    runs first within it, and the exit margin."""
    return TERMINATION_GRACE_SECONDS - drain_delay - EXIT_MARGIN_SECONDS


def shutdown_timeout(engine_args: list[str], *, drain_delay: int) -> list[str]:
    """`--shutdown-timeout` of `shutdown_timeout_seconds`, or nothing when engineArgs sets its own; theirs must be
    whole seconds and no longer (EngineArgValue), since the kubelet would kill vLLM mid-drain."""
    longest = shutdown_timeout_seconds(drain_delay)
    given = [
        token.partition("=")[2] if "=" in token else next(iter(engine_args[index + 1 :]), "")
        for index, token in enumerate(engine_args)
        if flag_name(token) == SHUTDOWN_TIMEOUT_FLAG
    ]
    for value in given:
        if not re.fullmatch(r"[0-9]+", value) or int(value) > longest:
            raise SpecProblem(
                "EngineArgValue",
                f"engineArgs: {SHUTDOWN_TIMEOUT_FLAG} must be whole seconds from 0 to {longest} (the pod's "
                f"{TERMINATION_GRACE_SECONDS} s grace period less its {drain_delay} s preStop delay and the time "
                f"vLLM needs to exit), not {value!r}",
            )
    return [] if given else [SHUTDOWN_TIMEOUT_FLAG, str(longest)]


def lora_target_modules(names: list[str]) -> list[str]:
    """vLLM's --lora-target-modules for spec.lora.targetModules: the names as given (vLLM matches q_proj to its fused
    qkv_proj itself), then its experts module when an expert projection is allowed. vLLM then builds LoRA only
    where an admitted adapter may have it: a router or lm_head that no adapter may target adds no work per step."""
    modules = list(dict.fromkeys(names))
    if EXPERT_PROJECTIONS & set(modules) and VLLM_EXPERTS_MODULE not in modules:
        modules.append(VLLM_EXPERTS_MODULE)
    return modules


def vllm_env(spec: ModelServerSpec, *, kernel_configs: bool) -> list[dict[str, Any]]:
    """The vLLM container's env: ours, then the user's (checked: none may override ours)."""
    check_env(spec)
    env: list[dict[str, Any]] = [
        {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": ADMIN_KEY_FILE_ENV, "value": ADMIN_KEY_FILE},
    ]
    if spec.api_key_secret is not None:
        env.append({"name": "VLLM_API_KEY", "valueFrom": api_key_source(spec)})
    if kernel_configs:
        env.append({"name": "VLLM_TUNED_CONFIG_FOLDER", "value": KERNEL_CONFIGS_DIR})
    if spec.kernels.compile_cache is not None:
        env += [{"name": name, "value": value} for name, value in COMPILE_CACHE_ENV.items()]
    if spec.kernels.implementation == KernelImplementation.MOELORA:
        env.append({"name": "MOELORA_KERNEL", "value": "moelora"})
        if spec.gpus > 0:
            # LoRA kernels on a second CUDA stream overlap the base GEMMs (docs/benchmarks.md); CUDA only, as vLLM
            # refuses it on the CPU, where the plugin also runs (gpus: 0, moelora.local).
            env.append({"name": "VLLM_LORA_ENABLE_DUAL_STREAM", "value": "1"})
            # The plugin reads the agent's checked adapters while the engine warms up (vllm_plugin/host_adapters.py).
            env.append({"name": AHEAD_ENV, "value": ADAPTER_CACHE_DIR})
        if spec.kernels.expert_lora_weights == ExpertLoraWeights.INT8:
            # With gpus 0 too: the plugin, not the operator, keeps the model's dtype where int8 does not run.
            env.append({"name": EXPERT_LORA_WEIGHTS_ENV, "value": ExpertLoraWeights.INT8.value})
    return env + token_env(spec) + user_env(spec)
