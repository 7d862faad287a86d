"""LoRAAdapter: one fine-tune in S3, served by every replica of one ModelServer under its own model name."""

from __future__ import annotations

import datetime
import enum
import fnmatch
import urllib.parse
from collections.abc import Collection
from typing import Annotated

from pydantic import ConfigDict, Field

from moelora.api.common import CONDITIONS_LIST_MAP, DNS_LABEL, SERVED_NAME, ApiModel, Condition, SecretRef
from moelora.api.placement import AdapterPlacement


class AdapterPhase(str, enum.Enum):
    """Pending, Downloading, Loaded or Failed."""

    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    LOADED = "Loaded"
    FAILED = "Failed"


class FailureReason(str, enum.Enum):
    """Why an adapter is not served. Each has its own row in the README's troubleshooting table."""

    MODEL_SERVER_NOT_FOUND = "ModelServerNotFound"
    SOURCE_NOT_FOUND = "SourceNotFound"
    SOURCE_NOT_ALLOWED = "SourceNotAllowed"
    ACCESS_DENIED = "AccessDenied"
    SECRET_NOT_FOUND = "SecretNotFound"
    CONFIG_MISSING = "ConfigMissing"
    CONFIG_INVALID = "ConfigInvalid"
    RANK_TOO_HIGH = "RankTooHigh"
    BASE_MODEL_MISMATCH = "BaseModelMismatch"
    UNSUPPORTED_TARGET_MODULES = "UnsupportedTargetModules"
    UNKNOWN_TARGET_MODULES = "UnknownTargetModules"
    UNSUPPORTED_FEATURE = "UnsupportedFeature"
    UNSAFE_WEIGHTS_FORMAT = "UnsafeWeightsFormat"
    WEIGHTS_MISSING = "WeightsMissing"
    TOO_LARGE = "TooLarge"
    UNSAFE_KEY = "UnsafeKey"
    VERSION_MISMATCH = "VersionMismatch"
    NAME_CONFLICT = "NameConflict"
    LOAD_FAILED = "LoadFailed"
    WEIGHTS_INVALID = "WeightsInvalid"
    WEIGHTS_MISMATCH = "WeightsMismatch"
    WEIGHTS_NON_FINITE = "WeightsNonFinite"
    WEIGHTS_OUT_OF_RANGE = "WeightsOutOfRange"
    OUTPUT_NON_FINITE = "OutputNonFinite"  # vLLM computed a NaN/inf logprob with it (the load-time output check)
    CACHE_FULL = "CacheFull"
    ENDPOINT_UNREACHABLE = "EndpointUnreachable"
    UPDATE_REJECTED = "UpdateRejected"  # a new version was refused; the pod keeps serving the last good one


class AdapterSource(ApiModel):
    """Where the adapter's files are in S3, and how to reach them."""

    uri: str = Field(
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$",
        description="s3://bucket/prefix/ holding adapter_config.json and adapter_model.safetensors.",
    )
    endpoint_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="For S3-compatible stores. Default: the ModelServer's. Another endpoint must be one the operator's "
        "policy allows, with a credentialsSecret of its own (else SourceNotAllowed).",
    )
    region: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9-]+$",
        description="The bucket's region, e.g. eu-west-1. Default: the ModelServer's.",
    )
    credentials_secret: SecretRef | None = Field(
        default=None,
        description="Secret with AWS_* keys. Default: the ModelServer's S3 credentials (sent only to its endpoint).",
    )

    @property
    def bucket(self) -> str:
        return self.uri.removeprefix("s3://").split("/", 1)[0]

    def refusal(
        self, *, server_endpoint: str | None, allowed_endpoints: Collection[str], allowed_buckets: Collection[str]
    ) -> str | None:
        """Why this source may not be fetched, or None. One rule for the operator and the agent: an adapter reads
        its server's endpoint, or one of `allowed_endpoints` (normalized, see `normalize_endpoint`) with its own
        credentials (the server's are never sent elsewhere); and a bucket matching `allowed_buckets` (globs; empty:
        any)."""
        if allowed_buckets and not any(fnmatch.fnmatchcase(self.bucket, pattern) for pattern in allowed_buckets):
            return f"bucket {self.bucket!r} is not in the operator's allowed S3 buckets"
        if self.endpoint_url is None or normalize_endpoint(self.endpoint_url) == normalize_endpoint(server_endpoint):
            return None
        if normalize_endpoint(self.endpoint_url) not in {normalize_endpoint(url) for url in allowed_endpoints}:
            return f"endpoint {self.endpoint_url!r} is neither the ModelServer's nor an allowed S3 endpoint"
        if self.credentials_secret is None:
            return (
                f"endpoint {self.endpoint_url!r} is not the ModelServer's: name a credentialsSecret for it (the "
                "server's own credentials are sent only to its own endpoint)"
            )
        return None


def normalize_endpoint(url: str | None) -> str:
    """scheme://host[:port][/path] in lowercase without a trailing slash; "" for none (the AWS default)."""
    if not url:
        return ""
    parsed = urllib.parse.urlsplit(url.strip())
    return f"{parsed.scheme.lower()}://{parsed.netloc.lower()}{parsed.path.rstrip('/')}"


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
    """Which ModelServer serves the adapter, where its files are, and the name clients ask for it by."""

    model_server: str = Field(
        pattern=DNS_LABEL, max_length=63, description="Name of the ModelServer (same namespace) that serves it."
    )
    source: AdapterSource
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=SERVED_NAME,
        description="The `model` name clients send. Default: metadata.name.",
    )
    pin: VersionPin | None = Field(
        default=None,
        description="Serve only these exact weights (one of etag, sha256); anything else fails with VersionMismatch. "
        "Default: whatever the prefix holds; a change there is loaded at the agents' next resync.",
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="With the server's spec.placement: how many replicas hold this adapter (at most the server's). "
        "Default: the server's placement.copies. Ignored without placement (every replica holds it).",
    )


class ReplicaAdapterState(ApiModel):
    """This adapter on one pod, written by that pod's agent."""

    loaded: bool = Field(default=False, description="True while vLLM on this pod serves the adapter.")
    state: AdapterPhase = Field(default=AdapterPhase.PENDING, description="Where this pod is with the adapter.")
    reason: str | None = Field(
        default=None, description="Why this pod does not serve it: a reason of the README's troubleshooting table."
    )
    last_error: str | None = Field(default=None, description="The last failure on this pod, for a person.")
    loaded_at: datetime.datetime | None = Field(default=None, description="When vLLM on this pod loaded it.")
    version: str | None = Field(default=None, description="Digest of the weights this pod serves.")
    observed_at: datetime.datetime | None = Field(
        default=None, description="When this pod's agent last changed this entry (written only on a change)."
    )
    rejected_version: str | None = Field(
        default=None,
        description="A newer version this pod refused (reason UpdateRejected, lastError says why) while it keeps "
        "serving `version`.",
    )
    load: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        description="Requests for the adapter in flight on this pod, on average (an estimate from vLLM's "
        "vllm:lora_requests_info); rewritten only when it changes by half or more.",
    )


class Rollup(str, enum.Enum):
    """Whether phase, counts and conditions include every pod's latest entry."""

    CURRENT = "Current"
    STALE = "Stale"


class LoRAAdapterStatus(ApiModel):
    """Written by moelora: the roll-up by the operator, each pod's state and the adapter's own facts by the agents."""

    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status was judged on."
    )
    phase: AdapterPhase = Field(
        default=AdapterPhase.PENDING,
        description="Loaded: served on every ready pod of the server. Downloading: on its way to some. Failed: see "
        "the Failed condition's reason. Pending: no ready pod, or no agent has reported yet.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready and Failed, one of each; their reasons are in the README's troubleshooting table.",
        json_schema_extra=CONDITIONS_LIST_MAP,
    )
    loaded_replicas: int | None = Field(
        default=None, ge=0, description="Ready pods of the server that serve the adapter now."
    )
    desired_replicas: int | None = Field(
        default=None, ge=0, description="Ready pods of the server, each of which should serve the adapter."
    )
    rollup: Rollup | None = Field(
        default=None,
        description="Stale: an agent changed its entry after the operator's last roll-up, so phase, counts and "
        "conditions may lag the entries (the operator is down or behind); Current once the operator has rolled up.",
    )
    rolled_up_at: datetime.datetime | None = Field(
        default=None, description="When the operator last changed phase, counts or conditions."
    )
    replicas: dict[str, ReplicaAdapterState] = Field(
        default_factory=dict, description="Per pod name: a map, so each agent patches only its own key."
    )
    on_demand_load: dict[str, Annotated[float, Field(ge=0, le=1e6)]] = Field(
        default_factory=dict,
        description="With placement: per pod that serves the adapter on demand (not assigned it), its requests in "
        "flight there on average, written by that pod's agent like `replicas.<pod>.load`. copiesMode Auto counts "
        "them with the assigned pods' load: requests a non-holder serves are load the adapter's copies should carry.",
    )
    served_name: str | None = Field(default=None, description="The `model` name clients send to use the adapter.")
    rank: int | None = Field(default=None, description="The LoRA rank (r) in adapter_config.json.")
    base_model: str | None = Field(
        default=None, description="base_model_name_or_path in adapter_config.json: the model it was trained on."
    )
    target_modules: list[str] | None = Field(
        default=None, description="target_modules in adapter_config.json: the modules the adapter changes."
    )
    size_bytes: int | None = Field(default=None, description="Bytes of the adapter's files as downloaded.")
    placement: AdapterPlacement | None = Field(
        default=None, description="With the server's spec.placement: the pods assigned to serve it (the operator's)."
    )


class LoRAAdapter(ApiModel):
    """A LoRA fine-tune in S3, served by a ModelServer under its own model name."""

    spec: LoRAAdapterSpec
    status: LoRAAdapterStatus = Field(default_factory=LoRAAdapterStatus)
