"""The adapter agent's container environment: the one contract between the operator, which renders it into the pod,
and the agent, which parses its settings from it.

Every variable's name, type and default lives here. The operator renders what it sets (`AgentEnv.entries`); the
agent parses `os.environ` (`AgentEnv.parse`); a variable left out means its default. The pod's own identity comes
from the downward API, so the model declares those fields' `fieldRef`s and the operator never fills them in.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

# Paths and ports both containers, the operator's manifests and the agent agree on.
VLLM_PORT = 8000
AGENT_PORT = 8081
ADAPTER_CACHE_DIR = "/var/lib/moelora/adapters"
# The per-pod key the agent writes and vLLM's admin guard reads (moelora.vllm_plugin.admin_guard keeps a stdlib-only
# copy; tests/api/test_agent_env.py holds the two equal).
ADMIN_KEY_FILE = "/var/run/moelora/admin/key"
_REQUIRED = "is required and empty"


class AgentEnvError(ValueError):
    """The environment does not describe a usable agent; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class FromPod:
    """A field the kubelet fills from the pod itself (the downward API): always rendered as this `fieldRef`."""

    field_path: str
    required: bool = True


def _comma_list(value: Any) -> Any:
    """Split "a, b," into ["a", "b"]: the one way a list travels in a variable."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


Names = Annotated[frozenset[str], BeforeValidator(_comma_list)]
Items = Annotated[tuple[str, ...], BeforeValidator(_comma_list)]
Seconds = Annotated[float, Field(gt=0)]


class AgentEnv(BaseModel):
    """What the agent is told. Field order is the order the operator renders the variables in."""

    # Fields by their Python name, variables by their name (`validation_alias`), both accepted.
    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True)

    # The pod itself, from the downward API.
    namespace: Annotated[str, FromPod("metadata.namespace")] = Field("", validation_alias="MOELORA_NAMESPACE")
    pod_name: Annotated[str, FromPod("metadata.name")] = Field("", validation_alias="MOELORA_POD_NAME")
    # For the Events the agent reports on its own pod.
    pod_uid: Annotated[str, FromPod("metadata.uid", required=False)] = Field("", validation_alias="MOELORA_POD_UID")
    # The ModelServer it serves adapters for.
    model_server: str = Field(min_length=1, validation_alias="MOELORA_MODEL_SERVER")
    base_model: str = Field(min_length=1, validation_alias="MOELORA_BASE_MODEL")
    # The base model's config.json; unset: no checks of adapters' tensors against the base model's modules and dims.
    base_model_config: pathlib.Path | None = Field(None, validation_alias="MOELORA_BASE_MODEL_CONFIG")
    max_lora_rank: int = Field(ge=1, validation_alias="MOELORA_MAX_LORA_RANK")
    target_modules: Names = Field(frozenset(), validation_alias="MOELORA_TARGET_MODULES")  # empty: any module
    vllm_url: str = Field(f"http://127.0.0.1:{VLLM_PORT}", validation_alias="MOELORA_VLLM_URL")
    cache_dir: pathlib.Path = Field(pathlib.Path(ADAPTER_CACHE_DIR), validation_alias="MOELORA_CACHE_DIR")
    cache_bytes: int = Field(20 * 2**30, ge=1, validation_alias="MOELORA_CACHE_BYTES")
    port: int = Field(AGENT_PORT, ge=0, validation_alias="MOELORA_PORT")
    # Python's own: glibc's malloc for Python's objects, in few arenas, so a parsed header's heap goes back to the OS.
    python_malloc: str | None = Field(None, validation_alias="PYTHONMALLOC")
    malloc_arena_max: int | None = Field(None, ge=1, validation_alias="MALLOC_ARENA_MAX")
    admin_key_file: pathlib.Path = Field(pathlib.Path(ADMIN_KEY_FILE), validation_alias="MOELORA_ADMIN_KEY_FILE")
    # spec.apiKeySecret, sent to vLLM as a Bearer token; rendered from the Secret, never as a literal.
    vllm_api_key: str | None = Field(None, repr=False, validation_alias="MOELORA_VLLM_API_KEY")
    # The S3 sources adapters may name: the operator's policy (moelora.api.AdapterSource.refusal applies it).
    allowed_s3_endpoints: Items = Field((), validation_alias="MOELORA_ALLOWED_S3_ENDPOINTS")
    allowed_s3_buckets: Items = Field((), validation_alias="MOELORA_ALLOWED_S3_BUCKETS")
    # The ModelServer's own S3 endpoint (boto3 reads the same variable); None: AWS's.
    server_s3_endpoint: str | None = Field(None, validation_alias="AWS_ENDPOINT_URL_S3")
    # Not rendered by the operator: defaults fit production, tests shorten them.
    max_adapter_bytes: int = Field(8 * 2**30, ge=1, validation_alias="MOELORA_MAX_ADAPTER_BYTES")
    resync_seconds: Seconds = Field(300.0, validation_alias="MOELORA_RESYNC_SECONDS")
    poll_seconds: Seconds = Field(5.0, validation_alias="MOELORA_POLL_SECONDS")
    download_workers: int = Field(8, ge=1, validation_alias="MOELORA_DOWNLOAD_WORKERS")
    # Faults of one S3 endpoint must not delay adapters elsewhere: deadlines, a rate floor, a cap per endpoint.
    list_timeout_seconds: Seconds = Field(60.0, validation_alias="MOELORA_LIST_TIMEOUT_SECONDS")  # one prefix listing
    download_timeout_seconds: Seconds = Field(1800.0, validation_alias="MOELORA_DOWNLOAD_TIMEOUT_SECONDS")
    # A transfer slower than this over rate_window_seconds is aborted.
    min_bytes_per_second: int = Field(64 * 1024, ge=0, validation_alias="MOELORA_MIN_BYTES_PER_SECOND")
    rate_window_seconds: Seconds = Field(30.0, validation_alias="MOELORA_RATE_WINDOW_SECONDS")
    endpoint_workers: int = Field(4, ge=1, validation_alias="MOELORA_ENDPOINT_WORKERS")  # transfers per S3 endpoint
    s3_read_timeout_seconds: Seconds = Field(20.0, validation_alias="MOELORA_S3_READ_TIMEOUT_SECONDS")  # one read
    # After vLLM is up, readiness stops waiting for adapters still on their way; with the agent's poll (5 s) on top,
    # a restarted pod is Ready within 30 s of vLLM answering (issue 17), whatever its adapters do.
    ready_wait_seconds: Seconds = Field(25.0, validation_alias="MOELORA_READY_WAIT_SECONDS")
    # Serve only the adapters the operator assigned to this pod (the StatefulSet of spec.placement sets it).
    placement: bool = Field(False, validation_alias="MOELORA_PLACEMENT")
    # With placement: the time over which each adapter's load is averaged.
    load_window_seconds: Seconds = Field(300.0, validation_alias="MOELORA_LOAD_WINDOW_SECONDS")
    # How long vLLM's resolver waits for an adapter it asks for (then 503).
    resolve_seconds: Seconds = Field(300.0, validation_alias="MOELORA_RESOLVE_SECONDS")

    @field_validator("vllm_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _placement_names_an_ordinal(self) -> AgentEnv:
        # Assignments name StatefulSet pods (`<server>-<ordinal>`): any other pod would wait forever for adapters.
        if self.placement and not re.fullmatch(re.escape(self.model_server) + r"-[0-9]+", self.pod_name):
            raise ValueError(
                f"{self.variable('placement')} needs a pod named {self.model_server}-<ordinal>, got {self.pod_name!r}"
            )
        return self

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable of `field`."""
        if field not in cls.model_fields:
            raise ValueError(f"AgentEnv has no field {field!r}")
        alias = cls.model_fields[field].validation_alias
        assert isinstance(alias, str)
        return alias

    @classmethod
    def entry(cls, field: str, value: object) -> dict[str, Any]:
        """One env entry of the agent's container, `value` written the way `parse` reads it back."""
        return {"name": cls.variable(field), "value": _text(value)}

    def entries(self, *, value_from: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The container's `env` for the fields set on this instance, in field order: the pod's own fields as their
        fieldRefs, those in `value_from` (by field name) as that `valueFrom`, the rest as values. A value that
        renders empty is left out: the API server drops an empty value, which would read as drift on every
        reconcile, and a missing variable means the same as an empty one to `parse`."""
        value_from = dict(value_from or {})
        if unknown := set(value_from) - set(type(self).model_fields):
            raise ValueError(f"AgentEnv has no fields {sorted(unknown)}")
        rendered: list[dict[str, Any]] = []
        for field, info in type(self).model_fields.items():
            name = self.variable(field)
            if (pod := _from_pod(info.metadata)) is not None:
                rendered.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": pod.field_path}}})
            elif field in value_from:
                rendered.append({"name": name, "valueFrom": dict(value_from.pop(field))})
            elif field in self.model_fields_set and (text := _text(getattr(self, field))):
                rendered.append({"name": name, "value": text})
        return rendered

    @classmethod
    def parse(cls, environ: Mapping[str, str]) -> AgentEnv:
        """The agent's settings from its environment (surrounding spaces ignored, empty as unset); AgentEnvError
        names each bad or missing variable."""
        values: dict[str, str] = {}
        for field, info in cls.model_fields.items():
            name = cls.variable(field)
            raw = environ.get(name, "").strip()
            if raw:
                values[name] = raw
            elif (pod := _from_pod(info.metadata)) is not None and pod.required:
                raise AgentEnvError(f"{name} {_REQUIRED}")
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise AgentEnvError("; ".join(_message(detail) for detail in error.errors())) from None


def _from_pod(metadata: list[Any]) -> FromPod | None:
    return next((item for item in metadata if isinstance(item, FromPod)), None)


def _text(value: object) -> str:
    """A field's value as its variable holds it; "" for none (None, False, an empty list)."""
    if value is None or value is False:
        return ""
    if value is True:
        return "1"
    if isinstance(value, frozenset):
        return ",".join(sorted(value))
    if isinstance(value, tuple | list):
        return ",".join(value)
    return str(value)


def _message(detail: ErrorDetails) -> str:
    """One validation error in the variable's terms: "MOELORA_PORT must be an integer, got 'x'"."""
    name = str(detail["loc"][0]) if detail["loc"] else ""
    got = detail.get("input")
    context = detail.get("ctx") or {}
    words = {
        "missing": _REQUIRED,
        "int_parsing": f"must be an integer, got {got!r}",
        "float_parsing": f"must be a number, got {got!r}",
        "bool_parsing": f"must be 1 or 0, got {got!r}",
        "greater_than_equal": f"must be at least {context.get('ge')}, got {got}",
        "greater_than": f"must be positive, got {got}",
        "value_error": str(context.get("error", detail["msg"])),
    }.get(detail["type"], detail["msg"])
    return f"{name} {words}" if name else words
