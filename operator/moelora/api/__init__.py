"""The moelora API: pydantic models of the custom resources, and the CRDs generated from them.

Everything here is pure data: no kopf, no Kubernetes client, no boto3, no torch. The operator and the adapter
agent both import it, and never each other.
"""

from moelora.api.common import API_VERSION, GROUP, VERSION, Condition, ConditionStatus, SecretRef
from moelora.api.env import EnvFromSource, EnvVar, EnvVarSource, KeySelector, TokenSecret
from moelora.api.lora_adapter import (
    AdapterPhase,
    AdapterSource,
    FailureReason,
    LoRAAdapter,
    LoRAAdapterSpec,
    LoRAAdapterStatus,
    ReplicaAdapterState,
    VersionPin,
    normalize_endpoint,
)
from moelora.api.model_server import (
    MAX_LORA_RANKS,
    AdapterCacheSpec,
    AdapterCounts,
    ApiKeySecret,
    KernelConfigMode,
    KernelImplementation,
    KernelSpec,
    LocalObjectRef,
    LoRASpec,
    ModelServer,
    ModelServerSpec,
    ModelServerStatus,
    ModelSpec,
    MoeShape,
    ResourceSpec,
    S3Spec,
)
from moelora.api.placement import AdapterPlacement, PlacementSpec

__all__ = [
    "ApiKeySecret",
    "API_VERSION",
    "GROUP",
    "MAX_LORA_RANKS",
    "VERSION",
    "AdapterCacheSpec",
    "AdapterCounts",
    "AdapterPhase",
    "AdapterPlacement",
    "AdapterSource",
    "Condition",
    "ConditionStatus",
    "EnvFromSource",
    "EnvVar",
    "EnvVarSource",
    "FailureReason",
    "KernelConfigMode",
    "KernelImplementation",
    "KernelSpec",
    "KeySelector",
    "LoRAAdapter",
    "LoRAAdapterSpec",
    "LoRAAdapterStatus",
    "LoRASpec",
    "LocalObjectRef",
    "ModelServer",
    "ModelServerSpec",
    "ModelServerStatus",
    "ModelSpec",
    "MoeShape",
    "PlacementSpec",
    "ReplicaAdapterState",
    "ResourceSpec",
    "S3Spec",
    "SecretRef",
    "TokenSecret",
    "VersionPin",
    "normalize_endpoint",
]
