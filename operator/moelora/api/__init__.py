"""The moelora API: pydantic models of the custom resources, and the CRDs generated from them.

Everything here is pure data: no kopf, no Kubernetes client, no boto3, no torch. The operator and the adapter
agent both import it, and never each other.
"""

from moelora.api.common import GROUP, VERSION, API_VERSION, Condition, ConditionStatus, SecretRef
from moelora.api.loraadapter import (
    AdapterPhase,
    AdapterSource,
    FailureReason,
    LoRAAdapter,
    LoRAAdapterSpec,
    LoRAAdapterStatus,
    ReplicaAdapterState,
    VersionPin,
)
from moelora.api.modelserver import (
    AdapterCacheSpec,
    AdapterCounts,
    KernelConfigMode,
    KernelImplementation,
    KernelSpec,
    LoRASpec,
    MAX_LORA_RANKS,
    ModelServer,
    ModelServerSpec,
    ModelServerStatus,
    ModelSpec,
    ResourceSpec,
    S3Spec,
)

__all__ = [
    "API_VERSION", "GROUP", "VERSION", "Condition", "ConditionStatus", "SecretRef",
    "AdapterPhase", "AdapterSource", "FailureReason", "LoRAAdapter", "LoRAAdapterSpec", "LoRAAdapterStatus",
    "ReplicaAdapterState", "VersionPin",
    "AdapterCacheSpec", "AdapterCounts", "KernelConfigMode", "KernelImplementation", "KernelSpec", "LoRASpec",
    "MAX_LORA_RANKS", "ModelServer", "ModelServerSpec", "ModelServerStatus", "ModelSpec", "ResourceSpec", "S3Spec",
]
