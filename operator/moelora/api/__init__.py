"""The moelora API: pydantic models of the custom resources, and the CRDs generated from them.

Everything here is pure data: no kopf, no Kubernetes client, no boto3, no torch. The operator and the adapter
agent both import it, and never each other.
"""

from moelora.api.autoscaling import AutoscalerEngine, AutoscalingSpec, AutoscalingTarget
from moelora.api.common import API_VERSION, GROUP, VERSION, Condition, ConditionStatus, SecretRef
from moelora.api.env import EnvFromSource, EnvVar, EnvVarSource, KeySelector, TokenSecret
from moelora.api.kernel_spec import (
    CompileCacheSpec,
    ExpertLoraWeights,
    KernelConfigMode,
    KernelImplementation,
    KernelSpec,
    MoeShape,
)
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
    normalize_endpoint,
)
from moelora.api.model import LoadFormat, ModelCachePhase, ModelCacheSpec, ModelCacheStatus, ModelSpec
from moelora.api.model_server import (
    MAX_LORA_RANKS,
    AdapterCacheSpec,
    AdapterCounts,
    ApiKeySecret,
    LocalObjectRef,
    LoRASpec,
    ModelServer,
    ModelServerSpec,
    ModelServerStatus,
    ResourceSpec,
    S3Spec,
)
from moelora.api.placement import AdapterPlacement, CopiesMode, PlacementSpec
from moelora.api.routing import EndpointPickerRef, GatewayRouting, ParentRef, RoutingSpec

__all__ = [
    "ApiKeySecret",
    "API_VERSION",
    "GROUP",
    "MAX_LORA_RANKS",
    "VERSION",
    "AdapterCacheSpec",
    "AutoscalerEngine",
    "AutoscalingSpec",
    "AutoscalingTarget",
    "EndpointPickerRef",
    "GatewayRouting",
    "ParentRef",
    "RoutingSpec",
    "AdapterCounts",
    "AdapterPhase",
    "AdapterPlacement",
    "CopiesMode",
    "AdapterSource",
    "Condition",
    "ConditionStatus",
    "EnvFromSource",
    "EnvVar",
    "EnvVarSource",
    "ExpertLoraWeights",
    "FailureReason",
    "KernelConfigMode",
    "KernelImplementation",
    "CompileCacheSpec",
    "KernelSpec",
    "KeySelector",
    "LoRAAdapter",
    "LoRAAdapterSpec",
    "LoRAAdapterStatus",
    "LoRASpec",
    "LoadFormat",
    "LocalObjectRef",
    "ModelCachePhase",
    "ModelCacheSpec",
    "ModelCacheStatus",
    "ModelServer",
    "ModelServerSpec",
    "ModelServerStatus",
    "ModelSpec",
    "MoeShape",
    "PlacementSpec",
    "ReplicaAdapterState",
    "Rollup",
    "ResourceSpec",
    "S3Spec",
    "SecretRef",
    "TokenSecret",
    "VersionPin",
    "normalize_endpoint",
]
