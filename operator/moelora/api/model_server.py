"""ModelServer: one base MoE model served by vLLM with multi-LoRA, on N replicas of M GPUs each."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.json_schema import JsonDict

from moelora.api.autoscaling import AutoscalingSpec
from moelora.api.common import (
    CONDITIONS_LIST_MAP,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    QUANTITY,
    ApiModel,
    Condition,
    SecretRef,
)
from moelora.api.env import EnvFromSource, EnvVar
from moelora.api.kernel_spec import KernelSpec
from moelora.api.model import ModelCacheStatus, ModelSpec
from moelora.api.placement import PlacementSpec
from moelora.api.pod_schemas import POD_SECURITY_CONTEXT, SECURITY_CONTEXT, TOPOLOGY_SPREAD
from moelora.api.routing import RoutingSpec
from moelora.api.scheduling import AFFINITY, KEY_RULE_MAP, LABEL_KEY, LABEL_VALUE, TOLERATION

# vLLM accepts only these values for --max-lora-rank (vllm/config/lora.py, MaxLoRARanks).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MaxLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]

# Lets the API server fill in the defaults inside an object the user left out.
DEFAULT_EMPTY: JsonDict = {"default": {}}
# Label key -> value, and resource name -> quantity, bounded like every map here (see moelora.api.scheduling).
LABEL_MAP: JsonDict = {
    "maxProperties": 8,
    "additionalProperties": {"type": "string", "maxLength": LABEL_VALUE},
    **KEY_RULE_MAP,
}
RESOURCE_MAP: JsonDict = {
    "maxProperties": 8,
    "additionalProperties": {"type": "string", "pattern": QUANTITY, "maxLength": 64},
    **KEY_RULE_MAP,
}


class LoRASpec(ApiModel):
    """vLLM's multi-LoRA limits."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.maxCpuLoras) || self.maxCpuLoras >= self.maxLoras",
                    "message": "maxCpuLoras must be at least maxLoras",
                    "fieldPath": ".maxCpuLoras",
                }
            ]
        }
    )

    max_loras: int = Field(default=8, ge=1, le=512, description="Adapters in one GPU batch (--max-loras).")
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description="Adapters kept in CPU memory (--max-cpu-loras); at least maxLoras. Default: vLLM's (= maxLoras).",
    )
    max_lora_rank: MaxLoraRank = Field(default=16, description="Highest adapter rank served (--max-lora-rank).")
    fully_sharded: bool = Field(default=False, description="Shard LoRA weights across tensor-parallel ranks.")
    target_modules: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Modules adapters may target, by PEFT's names (q_proj, gate_proj...). Default: any; adapters naming "
            "others are refused. vLLM then builds LoRA for these only (--lora-target-modules; an expert projection "
            "selects the MoE experts), so a module no adapter may target (a router, lm_head) costs nothing per step."
        ),
    )


class ResourceSpec(ApiModel):
    """Extra container resources for the vLLM container; GPUs come from `gpus`."""

    requests: dict[str, str] = Field(
        default_factory=dict,
        description="Resource name to quantity, e.g. {cpu: '8', memory: 64Gi}: what the scheduler reserves.",
        json_schema_extra=RESOURCE_MAP,
    )
    limits: dict[str, str] = Field(
        default_factory=dict,
        description="Resource name to quantity, e.g. {memory: 96Gi}: the most the container may use.",
        json_schema_extra=RESOURCE_MAP,
    )


class S3Spec(ApiModel):
    """How the server's pods reach S3 (model weights and adapters that name no credentials of their own)."""

    credentials_secret: SecretRef | None = Field(
        default=None,
        description="Secret with AWS_* keys. Absent: the pod's own identity (IRSA, pod identity).",
    )
    endpoint_url: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^https?://\S+$",
        description="For S3-compatible stores (MinIO, Ceph...).",
    )
    region: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[a-z0-9-]+$",
        description="The buckets' region, e.g. eu-west-1 (the pods' AWS_REGION).",
    )


class AdapterCacheSpec(ApiModel):
    """Each replica's disk cache of downloaded adapters."""

    size_limit: str = Field(
        default="20Gi",
        max_length=64,
        pattern=QUANTITY,
        description="Disk for downloaded adapters per replica; least recently used are evicted.",
    )


class ApiKeySecret(ApiModel):
    """A key of a Secret in the ModelServer's namespace holding the API key clients must send."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="The Secret's name.")
    key: str = Field(
        default="api-key", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253, description="The key holding the API key."
    )


class LocalObjectRef(ApiModel):
    """An object in the ModelServer's namespace, by name."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="The object's name.")


class ModelServerSpec(ApiModel):
    """What to serve and how: the base model, replicas and GPUs, vLLM's LoRA limits, kernels and S3 access."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.routing) || !has(self.routing.gateway) || "
                    "!has(self.routing.gateway.routeToHome) || !self.routing.gateway.routeToHome || "
                    "has(self.placement)",
                    "message": "routing.gateway.routeToHome needs spec.placement",
                    "fieldPath": ".routing.gateway.routeToHome",
                }
            ]
        }
    )

    model: ModelSpec
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="vLLM serving image; one the operator's policy allows (else ImageNotAllowed). Default: the "
        "operator's pinned moelora server image.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Pods, each serving the whole model and every adapter. Also set by `kubectl scale` and "
        "autoscalers (the scale subresource). 0 stops serving and keeps the adapters' objects.",
    )
    gpus: int = Field(
        default=1, ge=0, le=16, description="GPUs per replica; also vLLM's --tensor-parallel-size. 0 runs on CPU."
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Pods (one per node, each with `gpus` GPUs) that serve one replica together. Above 1: a "
        "LeaderWorkerSet runs vLLM across them over Ray, --pipeline-parallel-size = nodes.",
    )
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu", max_length=LABEL_KEY, description="Extended resource name of the GPUs."
    )
    resources: ResourceSpec = Field(default_factory=ResourceSpec, json_schema_extra=DEFAULT_EMPTY)
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pods must run on. kernels.configs=auto reads the GPU model from "
        "nvidia.com/gpu.product here.",
        json_schema_extra=LABEL_MAP,
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=8,
        description="Taints the pods tolerate (Kubernetes Toleration objects), e.g. those of a GPU node pool.",
        json_schema_extra={"items": TOLERATION},
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="Affinity of the pods (a Kubernetes Affinity object, its common fields with bounded lists), "
        "e.g. to spread replicas over nodes.",
        json_schema_extra=AFFINITY,
    )
    lora: LoRASpec = Field(default_factory=LoRASpec, json_schema_extra=DEFAULT_EMPTY)
    routing: RoutingSpec = Field(default_factory=RoutingSpec, json_schema_extra=DEFAULT_EMPTY)
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Set: an autoscaler owns spec.replicas within its bounds (see the README)."
    )
    kernels: KernelSpec = Field(default_factory=KernelSpec, json_schema_extra=DEFAULT_EMPTY)
    engine_args: list[Annotated[str, Field(max_length=256)]] = Field(
        default_factory=list,
        max_length=24,
        description="Extra vLLM flags, e.g. ['--max-model-len=8192']. Flags moelora sets itself are refused.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=10,
        description="Extra environment variables of the vLLM container, each a value or a valueFrom (Secret, "
        "ConfigMap, downward API). Variables moelora sets itself are refused.",
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=8,
        description="Secrets and ConfigMaps whose keys all become variables of the vLLM container; env and "
        "moelora's own variables win over them.",
    )
    api_key_secret: ApiKeySecret | None = Field(
        default=None,
        description=(
            "Clients must then send `Authorization: Bearer <key>` (vLLM's VLLM_API_KEY); the adapter agent sends it "
            "too. Use this instead of --api-key in engineArgs, which would lock the agent out."
        ),
    )
    s3: S3Spec = Field(default_factory=S3Spec, json_schema_extra=DEFAULT_EMPTY)
    adapter_cache: AdapterCacheSpec = Field(default_factory=AdapterCacheSpec, json_schema_extra=DEFAULT_EMPTY)
    placement: PlacementSpec | None = Field(
        default=None,
        description="Each adapter on a few replicas (a StatefulSet of stable pod names) instead of all of them; "
        "only with nodes 1. Default: every replica serves every adapter (a Deployment).",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ServiceAccount of the pods (for IRSA / pod identity). Default: the chart's server account.",
    )
    image_pull_secrets: list[LocalObjectRef] = Field(
        default_factory=list,
        max_length=4,
        description="Secrets of type kubernetes.io/dockerconfigjson for pulling the images from a private registry.",
    )
    priority_class_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="PriorityClass of the pods, e.g. so serving preempts batch jobs on the GPU nodes.",
    )
    pod_annotations: dict[str, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict,
        max_length=8,
        description="Annotations added to the pods (not moelora.io/ ones, which are moelora's).",
        json_schema_extra=KEY_RULE_MAP,
    )
    pod_labels: dict[str, Annotated[str, Field(max_length=LABEL_VALUE)]] = Field(
        default_factory=dict,
        max_length=8,
        json_schema_extra=KEY_RULE_MAP,
        description="Labels added to the pods. The labels moelora sets itself (its selector among them) are refused.",
    )
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=2,
        description="How to spread the pods (Kubernetes TopologySpreadConstraint objects). One without a "
        "labelSelector gets this server's pod selector. Default: none, so the cluster's default spreading applies.",
        json_schema_extra={"items": TOPOLOGY_SPREAD},
    )
    pod_security_context: dict[str, Any] = Field(
        default_factory=dict,
        description="Merged over moelora's pod securityContext (a Kubernetes PodSecurityContext; defaults: non-root "
        "uid/gid/fsGroup 2000, seccomp RuntimeDefault). Values the restricted Pod Security Standard forbids are "
        "refused.",
        json_schema_extra=POD_SECURITY_CONTEXT,
    )
    security_context: dict[str, Any] = Field(
        default_factory=dict,
        description="Merged over the vllm container's securityContext (a Kubernetes SecurityContext; defaults: no "
        "privilege escalation, every capability dropped, read-only root filesystem). Values the restricted Pod "
        "Security Standard forbids are refused; the agent's stays moelora's.",
        json_schema_extra=SECURITY_CONTEXT,
    )


class AdapterCounts(ApiModel):
    """The LoRAAdapters that name this server, by phase."""

    desired: int = Field(default=0, description="LoRAAdapters that name this server.")
    loaded: int = Field(default=0, description="Of those, loaded on every ready pod (phase Loaded).")
    failed: int = Field(default=0, description="Of those, failed (phase Failed).")


class ModelServerStatus(ApiModel):
    """Written by the operator, from the Deployment, its pods and the adapters."""

    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status was judged on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing and Degraded, one of each; their reasons are in the README's "
        "troubleshooting table.",
        json_schema_extra=CONDITIONS_LIST_MAP,
    )
    replicas: int = Field(default=0, description="Pods of the server's Deployment, of any version.")
    ready_replicas: int = Field(default=0, description="Pods ready to serve requests.")
    selector: str | None = Field(default=None, description="Label selector of the pods (for the scale subresource).")
    endpoint: str | None = Field(default=None, description="OpenAI-compatible base URL inside the cluster.")
    adapters: AdapterCounts = Field(default_factory=AdapterCounts)
    model_cache: ModelCacheStatus | None = Field(default=None, description="Set when spec.model.cache is.")


class ModelServer(ApiModel):
    """A base MoE model served by vLLM with multi-LoRA enabled."""

    spec: ModelServerSpec
    status: ModelServerStatus = Field(default_factory=ModelServerStatus)


MODEL_SERVER_NAME = DNS_LABEL  # its Service takes its name
