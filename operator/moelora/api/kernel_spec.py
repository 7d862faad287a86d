"""How a ModelServer's fused MoE-LoRA kernels are chosen and configured (spec.kernels)."""

from __future__ import annotations

import enum

from pydantic import ConfigDict, Field

from moelora.api.common import DNS_SUBDOMAIN, ApiModel


class KernelConfigMode(str, enum.Enum):
    """Where the fused MoE-LoRA kernel configs come from: none, auto or configMap."""

    NONE = "none"
    AUTO = "auto"
    CONFIG_MAP = "configMap"


class KernelImplementation(str, enum.Enum):
    """Which fused MoE-LoRA kernel runs: vllm or moelora."""

    VLLM = "vllm"
    MOELORA = "moelora"


class ExpertLoraWeights(str, enum.Enum):
    """How the moelora kernel keeps the experts' LoRA weights: model (the model's dtype) or int8."""

    MODEL = "model"
    INT8 = "int8"


class MoeShape(ApiModel):
    """The model's MoE layer shape, which picks the bundled kernel configs tuned for it."""

    hidden_size: int = Field(ge=1, le=1_000_000, description="hidden_size in the model's config.json.")
    moe_intermediate_size: int = Field(
        ge=1,
        le=1_000_000,
        description="One expert's intermediate size: moe_intermediate_size in the model's config.json "
        "(intermediate_size where the model has no separate MoE value, e.g. GPT-OSS).",
    )
    num_experts: int = Field(
        ge=1,
        le=100_000,
        description="Experts per MoE layer: num_experts (num_local_experts for GPT-OSS) in the model's config.json.",
    )


class CompileCacheSpec(ApiModel):
    """A PersistentVolumeClaim of the user's that keeps compiled kernels across pods and restarts."""

    claim_name: str = Field(
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="PersistentVolumeClaim in the server's namespace that holds Triton's and vLLM's compile caches, "
        "mounted read-write by every replica (ReadWriteMany where replicas run on several nodes). Each server image "
        "gets its own directory in it, so an upgrade never reads another version's artifacts.",
    )


class KernelSpec(ApiModel):
    """Tuned fused MoE-LoRA kernel configs, and which kernel runs them."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.configs == 'configMap' ? has(self.configMapName) : !has(self.configMapName)",
                    "message": "configMapName is required when configs is configMap, and only then",
                    "fieldPath": ".configMapName",
                },
                {
                    "rule": "self.expertLoraWeights != 'int8' || self.implementation == 'moelora'",
                    "message": "expertLoraWeights int8 needs implementation moelora",
                    "fieldPath": ".expertLoraWeights",
                },
            ]
        }
    )

    configs: KernelConfigMode = Field(
        default=KernelConfigMode.NONE,
        description="none: vLLM's defaults. auto: the bundled set for this model's shape and GPU. "
        "configMap: the ConfigMap named in configMapName.",
    )
    config_map_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="ConfigMap in the server's namespace whose keys are the kernel config JSON files (as the tuner "
        "writes them). Required when configs is configMap, and only then.",
    )
    shape: MoeShape | None = Field(
        default=None,
        description="The values from the model's config.json that auto matches the bundled sets against. Only "
        "needed for auto when model.name is not a model moelora knows the shape of (see the README).",
    )
    implementation: KernelImplementation = Field(
        default=KernelImplementation.VLLM,
        description="vllm: vLLM's own fused MoE-LoRA kernel. moelora: ours, through the moelora vLLM plugin.",
    )
    compile_cache: CompileCacheSpec | None = Field(
        default=None,
        description="Set: Triton's and vLLM's compile caches live on this claim instead of the pod's own disk, so a "
        "new replica or a restarted pod reuses what an earlier pod of the same image compiled.",
    )
    expert_lora_weights: ExpertLoraWeights = Field(
        default=ExpertLoraWeights.MODEL,
        description="model: the experts' LoRA weights in the model's dtype, as vLLM keeps them. int8 (implementation "
        "moelora only): the experts' LoRA A and B in int8 with a float32 scale per rank, about half the bytes a "
        "decode step reads for them; the attention LoRA keeps the model's dtype, and the int8 copy adds half the "
        "experts' LoRA slot memory on top of vLLM's own. On a CPU the plugin keeps the model's dtype.",
    )
