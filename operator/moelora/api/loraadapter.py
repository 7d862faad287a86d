"""LoRAAdapter: one fine-tune in S3, served by every replica of one ModelServer under its own model name."""

from __future__ import annotations

import datetime
import enum

from pydantic import ConfigDict, Field

from moelora.api.common import DNS_LABEL, ApiModel, Condition, SecretRef


class AdapterPhase(str, enum.Enum):
    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    LOADED = "Loaded"
    FAILED = "Failed"


class FailureReason(str, enum.Enum):
    """Why an adapter is not served. Each has its own row in the README's troubleshooting table."""

    MODEL_SERVER_NOT_FOUND = "ModelServerNotFound"
    SOURCE_NOT_FOUND = "SourceNotFound"
    ACCESS_DENIED = "AccessDenied"
    SECRET_NOT_FOUND = "SecretNotFound"
    CONFIG_MISSING = "ConfigMissing"
    CONFIG_INVALID = "ConfigInvalid"
    RANK_TOO_HIGH = "RankTooHigh"
    BASE_MODEL_MISMATCH = "BaseModelMismatch"
    UNSUPPORTED_TARGET_MODULES = "UnsupportedTargetModules"
    UNSAFE_WEIGHTS_FORMAT = "UnsafeWeightsFormat"
    WEIGHTS_MISSING = "WeightsMissing"
    TOO_LARGE = "TooLarge"
    UNSAFE_KEY = "UnsafeKey"
    VERSION_MISMATCH = "VersionMismatch"
    NAME_CONFLICT = "NameConflict"
    LOAD_FAILED = "LoadFailed"
    WEIGHTS_INVALID = "WeightsInvalid"
    WEIGHTS_MISMATCH = "WeightsMismatch"
    CACHE_FULL = "CacheFull"
    ENDPOINT_UNREACHABLE = "EndpointUnreachable"


class AdapterSource(ApiModel):
    uri: str = Field(
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$",
        description="s3://bucket/prefix/ holding adapter_config.json and adapter_model.safetensors.",
    )
    endpoint_url: str | None = Field(
        default=None, pattern=r"^https?://\S+$", description="For S3-compatible stores. Default: the ModelServer's."
    )
    region: str | None = Field(default=None, pattern=r"^[a-z0-9-]+$")
    credentials_secret: SecretRef | None = Field(
        default=None, description="Secret with AWS_* keys. Default: the ModelServer's S3 credentials."
    )


class VersionPin(ApiModel):
    """Serve only these exact weights; anything else fails with VersionMismatch."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.etag) != has(self.sha256)",
                    "message": "set exactly one of etag and sha256",
                }
            ]
        }
    )

    etag: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="S3 ETag of adapter_model.safetensors (quotes optional).",
    )
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="SHA-256 of adapter_model.safetensors, lowercase hex."
    )


class LoRAAdapterSpec(ApiModel):
    model_server: str = Field(
        pattern=DNS_LABEL, max_length=63, description="Name of the ModelServer (same namespace) that serves it."
    )
    source: AdapterSource
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
        description="The `model` name clients send. Default: metadata.name.",
    )
    pin: VersionPin | None = None


class ReplicaAdapterState(ApiModel):
    """This adapter on one pod, written by that pod's agent."""

    loaded: bool = False
    state: AdapterPhase = AdapterPhase.PENDING
    reason: str | None = None
    last_error: str | None = None
    loaded_at: datetime.datetime | None = None
    version: str | None = Field(default=None, description="Digest of the weights this pod serves.")


class LoRAAdapterStatus(ApiModel):
    observed_generation: int | None = None
    phase: AdapterPhase = AdapterPhase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    replicas: dict[str, ReplicaAdapterState] = Field(
        default_factory=dict, description="Per pod name: a map, so each agent patches only its own key."
    )
    served_name: str | None = None
    rank: int | None = None
    base_model: str | None = None
    target_modules: list[str] | None = None
    size_bytes: int | None = None


class LoRAAdapter(ApiModel):
    """A LoRA fine-tune in S3, served by a ModelServer under its own model name."""

    spec: LoRAAdapterSpec
    status: LoRAAdapterStatus = Field(default_factory=LoRAAdapterStatus)
