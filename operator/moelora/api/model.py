"""Where a ModelServer's base model weights come from and how they reach the pods: per-pod download, the shared
cache (a claim filled once), vLLM's S3 streamer, or a claim of the user's."""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from moelora.api.common import DNS_SUBDOMAIN, QUANTITY, SERVED_NAME, ApiModel
from moelora.api.env import TokenSecret

AccessMode = Literal["ReadWriteMany", "ReadWriteOnce"]


class ModelCacheSpec(ApiModel):
    """A PersistentVolumeClaim the operator fills with the weights once (a Job), which every replica then mounts
    read-only: one download per model instead of one per pod."""

    size: str = Field(
        pattern=QUANTITY,
        max_length=64,
        description="The claim's storage request: the model's files plus headroom, e.g. 80Gi for a 60 GB model.",
    )
    storage_class_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="StorageClass of the claim. Default: the cluster's default class.",
    )
    access_modes: list[AccessMode] = Field(
        default_factory=lambda: list[AccessMode](["ReadWriteMany"]),
        min_length=1,
        max_length=2,
        description="The claim's access modes. ReadWriteMany (default): the fill Job writes it and replicas on any "
        "node read it. ReadWriteOnce only when every replica runs on the node the Job ran on. (ReadOnlyMany is not "
        "offered: a Job could not fill such a claim.)",
    )


class LoadFormat(str, enum.Enum):
    """How vLLM reads the weights: auto or streamer."""

    AUTO = "auto"
    STREAMER = "streamer"


class ModelSpec(ApiModel):
    """The base model: what it is (for adapter checks) and where its weights come from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.cache) || !has(self.source) || !self.source.startsWith('pvc://')",
                    "message": "cache is for hf:// and s3:// sources; a pvc:// source is mounted as it is",
                    "fieldPath": ".cache",
                },
                {
                    "rule": "!has(self.loadFormat) || self.loadFormat != 'streamer' || "
                    "(has(self.source) && self.source.startsWith('s3://') && !has(self.cache))",
                    "message": "loadFormat streamer needs an s3:// source and no cache",
                    "fieldPath": ".loadFormat",
                },
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        description="The base model's canonical id, e.g. openai/gpt-oss-20b. Adapters whose "
        "adapter_config.json names another base_model_name_or_path are refused.",
    )
    source: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^(hf://[^/\s]+/[^\s]+|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?|pvc://[a-z0-9][-a-z0-9.]*(/\S*)?)$",
        description="Where the weights are: hf://org/name (Hugging Face), s3://bucket/prefix, or "
        "pvc://claim/path (a PersistentVolumeClaim in the namespace). Default: hf://<name>.",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=SERVED_NAME,
        description="The `model` name clients use for the base model. Default: the ModelServer's name.",
    )
    token_secret: TokenSecret | None = Field(
        default=None,
        description="Secret key with a Hugging Face token for a gated or private model: vLLM's HF_TOKEN, always "
        "a secretKeyRef, never a literal.",
    )
    cache: ModelCacheSpec | None = Field(
        default=None,
        description="Fetch the weights once into a PersistentVolumeClaim the replicas share (hf:// and s3:// "
        "sources). Absent: every pod downloads them itself.",
    )
    size_hint: str | None = Field(
        default=None,
        pattern=QUANTITY,
        max_length=64,
        description="The weights' size on disk, for pods that download them themselves: the model volume's "
        "sizeLimit and the vllm container's ephemeral-storage request. Absent: no limit and no request.",
    )
    load_format: LoadFormat = Field(
        default=LoadFormat.AUTO,
        description="auto: vLLM reads local files. streamer: vLLM streams the safetensors straight from an s3:// "
        "source (--load-format runai_streamer; the image needs the runai-model-streamer package), no download.",
    )

    @model_validator(mode="after")
    def _source_fits(self) -> ModelSpec:
        """The CEL rules above, for objects that reach the operator without the API server's checks."""
        source = self.source or ""
        if self.cache is not None and source.startswith("pvc://"):
            raise ValueError("cache is for hf:// and s3:// sources; a pvc:// source is mounted as it is")
        if self.load_format == LoadFormat.STREAMER and (not source.startswith("s3://") or self.cache is not None):
            raise ValueError("loadFormat streamer needs an s3:// source and no cache")
        return self


class ModelCachePhase(str, enum.Enum):
    """Where the shared model cache stands: Pending, Filling, Ready or Failed."""

    PENDING = "Pending"
    FILLING = "Filling"
    READY = "Ready"
    FAILED = "Failed"


class ModelCacheStatus(ApiModel):
    """The shared model cache (spec.model.cache), from its claim and its fill Job."""

    phase: ModelCachePhase = Field(description="Pending (claim not bound), Filling, Ready or Failed.")
    claim_name: str = Field(description="The PersistentVolumeClaim holding the weights.")
    capacity: str | None = Field(default=None, description="The bound claim's capacity.")
    message: str = Field(default="", description="Why, in words.")
