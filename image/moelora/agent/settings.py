"""The agent's settings, read once from the environment the operator renders (docs/architecture.md)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections.abc import Mapping


class SettingsError(ValueError):
    """The environment does not describe a usable agent; the message names the variable."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    namespace: str
    pod_name: str
    model_server: str
    base_model: str
    max_lora_rank: int
    target_modules: frozenset[str]  # empty: any module
    vllm_url: str
    cache_dir: pathlib.Path
    cache_bytes: int
    port: int
    pod_uid: str = ""  # for the Events the agent reports on its own pod
    admin_key_file: pathlib.Path = pathlib.Path("/var/run/moelora/admin/key")  # the admin guard's key (we write it)
    vllm_api_key: str | None = dataclasses.field(default=None, repr=False)  # spec.apiKeySecret: sent as a Bearer
    # The S3 sources adapters may name (the operator's policy, rendered by it; AdapterSource.refusal applies it).
    server_s3_endpoint: str | None = None  # the ModelServer's own (AWS_ENDPOINT_URL_S3); None: AWS's
    allowed_s3_endpoints: tuple[str, ...] = ()
    allowed_s3_buckets: tuple[str, ...] = ()
    # Not rendered by the operator; defaults fit production, tests shorten them.
    max_adapter_bytes: int = 8 * 2**30
    resync_seconds: float = 300.0
    poll_seconds: float = 5.0
    download_workers: int = 8
    # Faults of one S3 endpoint must not delay adapters elsewhere: deadlines, a rate floor, a cap per endpoint.
    list_timeout_seconds: float = 60.0  # the whole listing of one adapter's prefix
    download_timeout_seconds: float = 1800.0  # the whole download of one adapter version
    min_bytes_per_second: int = 64 * 1024  # a transfer slower than this over rate_window_seconds is aborted
    rate_window_seconds: float = 30.0
    endpoint_workers: int = 4  # downloads (and listings) at once per S3 endpoint URL
    s3_read_timeout_seconds: float = 20.0  # one socket read
    # After vLLM is up, readiness stops waiting for adapters still on their way; with the agent's poll (5 s) on top,
    # a restarted pod is Ready within 30 s of vLLM answering (issue 17), whatever its adapters do.
    ready_wait_seconds: float = 25.0
    base_model_config: pathlib.Path | None = None  # the base model's config.json; unset: no dims checks
    placement: bool = False  # MOELORA_PLACEMENT: serve only the adapters the operator assigned to this pod
    load_window_seconds: float = 300.0  # with placement: the time over which each adapter's load is averaged


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise SettingsError(f"{name} is required and empty")
    return value


def _integer(env: Mapping[str, str], name: str, *, default: int | None = None, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        if default is None:
            raise SettingsError(f"{name} is required and empty")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, got {value}")
    return value


def _number(env: Mapping[str, str], name: str, *, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise SettingsError(f"{name} must be positive, got {value}")
    return value


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (default: os.environ); SettingsError names the first bad variable."""
    env = os.environ if env is None else env
    vllm_url = env.get("MOELORA_VLLM_URL", "").strip() or "http://127.0.0.1:8000"
    if not vllm_url.startswith(("http://", "https://")):
        raise SettingsError(f"MOELORA_VLLM_URL must be an http(s) URL, got {vllm_url!r}")
    modules = frozenset(m.strip() for m in env.get("MOELORA_TARGET_MODULES", "").split(",") if m.strip())
    settings = Settings(
        namespace=_required(env, "MOELORA_NAMESPACE"),
        pod_name=_required(env, "MOELORA_POD_NAME"),
        model_server=_required(env, "MOELORA_MODEL_SERVER"),
        base_model=_required(env, "MOELORA_BASE_MODEL"),
        max_lora_rank=_integer(env, "MOELORA_MAX_LORA_RANK", minimum=1),
        target_modules=modules,
        vllm_url=vllm_url.rstrip("/"),
        cache_dir=pathlib.Path(env.get("MOELORA_CACHE_DIR", "").strip() or "/var/lib/moelora/adapters"),
        cache_bytes=_integer(env, "MOELORA_CACHE_BYTES", default=20 * 2**30, minimum=1),
        port=_integer(env, "MOELORA_PORT", default=8081),
        pod_uid=env.get("MOELORA_POD_UID", "").strip(),
        admin_key_file=pathlib.Path(env.get("MOELORA_ADMIN_KEY_FILE", "").strip() or "/var/run/moelora/admin/key"),
        vllm_api_key=env.get("MOELORA_VLLM_API_KEY", "").strip() or None,
        max_adapter_bytes=_integer(env, "MOELORA_MAX_ADAPTER_BYTES", default=8 * 2**30, minimum=1),
        resync_seconds=_number(env, "MOELORA_RESYNC_SECONDS", default=300.0),
        poll_seconds=_number(env, "MOELORA_POLL_SECONDS", default=5.0),
        download_workers=_integer(env, "MOELORA_DOWNLOAD_WORKERS", default=8, minimum=1),
        list_timeout_seconds=_number(env, "MOELORA_LIST_TIMEOUT_SECONDS", default=60.0),
        download_timeout_seconds=_number(env, "MOELORA_DOWNLOAD_TIMEOUT_SECONDS", default=1800.0),
        min_bytes_per_second=_integer(env, "MOELORA_MIN_BYTES_PER_SECOND", default=64 * 1024),
        rate_window_seconds=_number(env, "MOELORA_RATE_WINDOW_SECONDS", default=30.0),
        endpoint_workers=_integer(env, "MOELORA_ENDPOINT_WORKERS", default=4, minimum=1),
        s3_read_timeout_seconds=_number(env, "MOELORA_S3_READ_TIMEOUT_SECONDS", default=20.0),
        ready_wait_seconds=_number(env, "MOELORA_READY_WAIT_SECONDS", default=25.0),
        base_model_config=pathlib.Path(base_config)
        if (base_config := env.get("MOELORA_BASE_MODEL_CONFIG", "").strip())
        else None,
        server_s3_endpoint=env.get("AWS_ENDPOINT_URL_S3", "").strip() or None,
        allowed_s3_endpoints=_list(env, "MOELORA_ALLOWED_S3_ENDPOINTS"),
        allowed_s3_buckets=_list(env, "MOELORA_ALLOWED_S3_BUCKETS"),
        placement=env.get("MOELORA_PLACEMENT", "").strip() == "1",
        load_window_seconds=_number(env, "MOELORA_LOAD_WINDOW_SECONDS", default=300.0),
    )
    # Assignments name StatefulSet pods (`<server>-<ordinal>`): any other pod would wait forever for adapters.
    if settings.placement and not re.fullmatch(re.escape(settings.model_server) + r"-[0-9]+", settings.pod_name):
        raise SettingsError(
            f"MOELORA_PLACEMENT needs a pod named {settings.model_server}-<ordinal>, got {settings.pod_name!r}"
        )
    return settings


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())
