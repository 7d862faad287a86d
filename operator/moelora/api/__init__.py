"""The moelora API: pydantic models of the custom resources, and the CRDs generated from them.

Everything here is pure data: no kopf, no Kubernetes client, no boto3, no torch. The operator and the adapter
agent both import it, and never each other.
"""

from moelora.api.common import API_VERSION, GROUP, VERSION, Condition, ConditionStatus, SecretRef
from moelora.api.lora_adapter import (
    AdapterPhase,
    AdapterSource,
    FailureReason,
    LoRAAdapter,
    LoRAAdapterSpec,
    LoRAAdapterStatus,
    ReplicaAdapterState,
    Rollup,
    VersionPin,
)
from moelora.api.model_server import (
    MAX_LORA_RANKS,
    AdapterCacheSpec,
    AdapterCounts,
    KernelConfigMode,
    KernelImplementation,
    KernelSpec,
    LoRASpec,
    ModelServer,
    ModelServerSpec,
    ModelServerStatus,
    ModelSpec,
    MoeShape,
    ResourceSpec,
    S3Spec,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "MAX_LORA_RANKS",
    "VERSION",
    "AdapterCacheSpec",
    "AdapterCounts",
    "AdapterPhase",
    "AdapterSource",
    "Condition",
    "ConditionStatus",
    "FailureReason",
    "KernelConfigMode",
    "KernelImplementation",
    "KernelSpec",
    "LoRAAdapter",
    "LoRAAdapterSpec",
    "LoRAAdapterStatus",
    "LoRASpec",
    "ModelServer",
    "ModelServerSpec",
    "ModelServerStatus",
    "ModelSpec",
    "MoeShape",
    "ReplicaAdapterState",
    "Rollup",
    "ResourceSpec",
    "S3Spec",
    "SecretRef",
    "VersionPin",
]
