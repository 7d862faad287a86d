"""The Deployment of a ModelServer: the pod exactly as docs/architecture.md "The pod" describes it.

A pure function of the spec, the operator settings and the kernel-config volume; `SpecProblem` for what only the
operator can refuse (engine flags, env).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from moelora.api import LoadFormat, ModelServerSpec
from moelora.api.agent_env import ADAPTER_CACHE_DIR, ADMIN_KEY_FILE, AGENT_PORT, AgentEnv
from moelora.operator.render import engine, naming, pod_options, security
from moelora.operator.render.kernel_configs import KernelConfigVolume
from moelora.operator.render.model_download import download_volume, streamer_env, with_disk_bounds
from moelora.operator.settings import Settings

VLLM_CONTAINER = "vllm"
AGENT_CONTAINER = "agent"
FETCH_CONTAINER = "fetch-model"
ADMIN_KEY_VOLUME = "admin-key"
KUBE_API_VOLUME = "kube-api-access"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# vLLM's $HOME as the agent sees it (read-only): where a hub download leaves the base model's config.json.
VLLM_HOME_IN_AGENT = "/var/run/moelora/vllm-home"
# glibc's malloc for Python's objects too, in two arenas: what a hostile adapter's large header took to parse goes back
# to the OS, where pymalloc's arenas kept it (docs/benchmarks.md, "Agent memory").
AGENT_PYTHON_MALLOC, AGENT_MALLOC_ARENA_MAX = "malloc", 2

# vLLM loads the weights before /health answers: a big MoE takes many minutes, so the startup probe allows an hour.
STARTUP_BUDGET_SECONDS = 3600
_PROBE_PERIOD = 10

_SUFFIXES: dict[str, int | Decimal] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(e[0-9]+|[KMGTPE]i|[mkKMGTPE])?$")


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity as whole bytes: "20Gi" -> 21474836480."""
    match = _QUANTITY.match(quantity)
    if not match:
        raise ValueError(f"not a quantity: {quantity!r}")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    factor = Decimal(10) ** int(suffix[1:]) if suffix.startswith("e") else Decimal(_SUFFIXES.get(suffix, 1))
    return int(number * factor)


def _http_probe(*, path: str, port: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def _resources(spec: ModelServerSpec) -> dict[str, Any]:
    requests = dict(spec.resources.requests)
    limits = dict(spec.resources.limits)
    if spec.gpus > 0:  # extended resources: request and limit must be equal
        requests[spec.gpu_resource_name] = limits[spec.gpu_resource_name] = str(spec.gpus)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def s3_env(spec: ModelServerSpec, *, endpoint: bool = True) -> list[dict[str, Any]]:
    """AWS_* for boto3: endpoint and region as values, credentials only as secretKeyRefs (never literals).
    `endpoint=False`: without the endpoint, which the agent's own variables already carry (AgentEnv)."""
    env: list[dict[str, Any]] = []
    if endpoint and spec.s3.endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": spec.s3.endpoint_url})
    if spec.s3.region:
        env.append({"name": "AWS_REGION", "value": spec.s3.region})
    if spec.s3.credentials_secret:
        secret = spec.s3.credentials_secret.name
        # The key pair must be there; a session token only for temporary credentials.
        for key, optional in (
            ("AWS_ACCESS_KEY_ID", False),
            ("AWS_SECRET_ACCESS_KEY", False),
            ("AWS_SESSION_TOKEN", True),
        ):
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": optional}}})
    return env


def base_model_config(model: engine.ModelRef) -> tuple[str, dict[str, Any]] | None:
    """Where the agent finds the base model's config.json (to check adapters' tensors against its modules and
    dims), and the read-only mount that puts it there: the model volume, or vLLM's $HOME for a hub download, whose
    snapshot revision is known only once vLLM has fetched it (the agent resolves the `*`). None when vLLM streams
    the weights from S3: no copy of the config is on a volume."""
    if model.vllm_model.startswith("s3://"):
        return None
    if model.scheme == "hf" and model.vllm_model != engine.MODELS_DIR:
        repo = model.vllm_model.replace("/", "--")
        path = f"{VLLM_HOME_IN_AGENT}/.cache/huggingface/hub/models--{repo}/snapshots/*/config.json"
        return path, {"name": security.HOME_VOLUME, "mountPath": VLLM_HOME_IN_AGENT, "readOnly": True}
    return f"{model.vllm_model}/config.json", {"name": "models", "mountPath": engine.MODELS_DIR, "readOnly": True}


def _streamer_s3_env(spec: ModelServerSpec) -> list[dict[str, Any]]:
    """With the streamer vLLM reads the weights from S3 itself, so it gets the pod's S3 access too."""
    return [*s3_env(spec), *streamer_env(spec)] if spec.model.load_format == LoadFormat.STREAMER else []


def _agent_env(
    spec: ModelServerSpec, *, name: str, settings: Settings, base_config: str | None
) -> list[dict[str, Any]]:
    env = AgentEnv(
        model_server=name,
        base_model=spec.model.name,
        base_model_config=base_config,
        max_lora_rank=spec.lora.max_lora_rank,
        target_modules=frozenset(spec.lora.target_modules or ()),
        vllm_url=f"http://127.0.0.1:{engine.VLLM_PORT}",
        cache_dir=ADAPTER_CACHE_DIR,
        cache_bytes=quantity_bytes(spec.adapter_cache.size_limit),
        port=AGENT_PORT,
        python_malloc=AGENT_PYTHON_MALLOC,
        malloc_arena_max=AGENT_MALLOC_ARENA_MAX,
        admin_key_file=ADMIN_KEY_FILE,
        # The operator's S3 policy, which the agent applies too (moelora.api.AdapterSource.refusal).
        allowed_s3_endpoints=settings.allowed_s3_endpoints,
        allowed_s3_buckets=settings.allowed_s3_buckets,
        server_s3_endpoint=spec.s3.endpoint_url,
    )
    api_key = {"vllm_api_key": engine.api_key_source(spec)} if spec.api_key_secret else {}
    return [*env.entries(value_from=api_key), *s3_env(spec, endpoint=False)]


def _service_account_volume() -> dict[str, Any]:
    """What the kubelet's automount would give, as a volume we can mount into the agent alone: the token (rotated
    by the kubelet), the cluster CA and the namespace."""
    return {
        "name": KUBE_API_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }


def deployment(
    spec: ModelServerSpec,
    *,
    name: str,
    namespace: str,
    settings: Settings,
    kernel_configs: KernelConfigVolume | None = None,
    model_claim: str | None = None,
) -> dict[str, Any]:
    """The Deployment for a ModelServer; `model_claim`: the filled shared cache (model_cache.py) to mount at the
    models path. Raises SpecProblem for what the operator refuses (engineArgs, env, security contexts, pod
    labels...)."""
    pod_options.check(spec, name=name)
    labels = naming.labels(name)
    model = engine.model_ref(spec)

    volumes: list[dict[str, Any]] = [
        {"name": "adapters", "emptyDir": {"sizeLimit": spec.adapter_cache.size_limit}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        # In memory: the key never touches the node's disk.
        {"name": ADMIN_KEY_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        _service_account_volume(),
    ]
    vllm_mounts = [
        {"name": "adapters", "mountPath": ADAPTER_CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": ADMIN_KEY_VOLUME, "mountPath": engine.ADMIN_KEY_DIR, "readOnly": True},
    ]
    init_containers: list[dict[str, Any]] = []
    claim = model_claim or (model.claim if model.scheme == "pvc" else None)
    if claim is not None:
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        vllm_mounts.append({"name": "models", "mountPath": engine.MODELS_DIR, "readOnly": True})
    elif model.scheme == "s3" and model.vllm_model == engine.MODELS_DIR:
        volumes.append({"name": "models", "emptyDir": download_volume(spec)})
        vllm_mounts.append({"name": "models", "mountPath": engine.MODELS_DIR, "readOnly": True})
        init_containers.append(
            {
                "name": FETCH_CONTAINER,
                "image": settings.agent_image,
                "command": ["python3", "-m", "moelora.agent"],
                "args": ["fetch-model", model.uri, engine.MODELS_DIR],
                "env": s3_env(spec),
                "volumeMounts": [{"name": "models", "mountPath": engine.MODELS_DIR}],
            }
        )
    image = spec.image or settings.server_image
    if spec.kernels.compile_cache is not None:
        volumes.append(
            {"name": "compile-cache", "persistentVolumeClaim": {"claimName": spec.kernels.compile_cache.claim_name}}
        )
        vllm_mounts.append(
            {
                "name": "compile-cache",
                "mountPath": engine.COMPILE_CACHE_DIR,
                "subPath": engine.compile_cache_path(image),
            }
        )
    template_annotations: dict[str, str] = {}
    if kernel_configs is not None:
        config_map: dict[str, Any] = {"name": kernel_configs.config_map_name}
        if kernel_configs.items is not None:
            config_map["items"] = kernel_configs.items
        volumes.append({"name": "kernel-configs", "configMap": config_map})
        vllm_mounts.append({"name": "kernel-configs", "mountPath": engine.KERNEL_CONFIGS_DIR, "readOnly": True})
        template_annotations[naming.ANNOTATION_KERNEL_CONFIGS] = kernel_configs.content_hash

    vllm: dict[str, Any] = {
        "name": VLLM_CONTAINER,
        "image": image,
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": engine.vllm_args(spec, name=name, drain_delay=settings.drain_delay_seconds),
        "env": engine.vllm_env(spec, kernel_configs=kernel_configs is not None) + _streamer_s3_env(spec),
        "ports": [{"name": "http", "containerPort": engine.VLLM_PORT, "protocol": "TCP"}],
        "volumeMounts": vllm_mounts,
        "startupProbe": _http_probe(
            path="/health", port="http", period=_PROBE_PERIOD, failures=STARTUP_BUDGET_SECONDS // _PROBE_PERIOD
        ),
        "readinessProbe": _http_probe(path="/health", port="http", period=5, failures=3),
        "livenessProbe": _http_probe(path="/health", port="http", period=_PROBE_PERIOD, failures=6),
    }
    if settings.drain_delay_seconds:
        # A terminating pod leaves the endpoints as it gets SIGTERM, but proxies, gateways and the endpoint picker
        # learn of it seconds later, and vLLM refuses new requests once it drains: it keeps serving until they do.
        # The native sleep action, on by default in every Kubernetes the chart supports, needs no binary in the image.
        vllm["lifecycle"] = {"preStop": {"sleep": {"seconds": settings.drain_delay_seconds}}}
    if env_from := engine.vllm_env_from(spec):
        vllm["envFrom"] = env_from
    if resources := _resources(spec):
        vllm["resources"] = resources
    base_config, base_config_mount = base_model_config(model) or (None, None)
    agent = {
        "name": AGENT_CONTAINER,
        "image": settings.agent_image,
        "command": ["python3", "-m", "moelora.agent"],
        "env": _agent_env(spec, name=name, settings=settings, base_config=base_config),
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "volumeMounts": [
            {"name": "adapters", "mountPath": ADAPTER_CACHE_DIR},
            {"name": ADMIN_KEY_VOLUME, "mountPath": engine.ADMIN_KEY_DIR},
            {"name": KUBE_API_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True},
            *([base_config_mount] if base_config_mount else []),
        ],
        # Ready only once its adapters are loaded, so a new pod takes traffic with them (see the architecture doc).
        "readinessProbe": _http_probe(path="/readyz", port="agent", period=2, failures=3),
        "livenessProbe": _http_probe(path="/healthz", port="agent", period=_PROBE_PERIOD, failures=6),
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
    }

    pod_spec: dict[str, Any] = {
        **pod_options.pod_fields(spec, name=name, settings=settings),
        # Only the agent talks to Kubernetes: the token is mounted into it alone (KUBE_API_VOLUME), never into vLLM.
        "automountServiceAccountToken": False,
        "containers": [vllm, agent],
        "volumes": volumes,
        # The preStop delay, then vLLM's drain of running requests (its --shutdown-timeout), both end inside this.
        "terminationGracePeriodSeconds": engine.TERMINATION_GRACE_SECONDS,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in spec.tolerations]
    if spec.affinity:
        pod_spec["affinity"] = dict(spec.affinity)

    pod_spec = security.secure(pod_spec, spec, server_container=VLLM_CONTAINER)
    pod_spec = with_disk_bounds(pod_spec, spec, server_container=VLLM_CONTAINER)
    template_metadata = pod_options.template_metadata(spec, labels=labels, annotations=template_annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": spec.replicas,
            # The default 10 minutes would call a big model's first load "stalled" (Degraded) while the startup
            # probe still allows it; give the rollout the probe's budget plus the image pull.
            "progressDeadlineSeconds": STARTUP_BUDGET_SECONDS + 600,
            "selector": {"matchLabels": naming.selector(name)},
            "template": {"metadata": template_metadata, "spec": pod_spec},
        },
    }
