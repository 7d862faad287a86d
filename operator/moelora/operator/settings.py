"""Operator settings, read once from the environment (the chart sets it) and passed to handlers via kopf's memo."""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping

DEFAULT_SERVER_IMAGE = "ghcr.io/moelora/moelora-server:0.1.0"
DEFAULT_SERVICE_ACCOUNT = "moelora-server"
DEFAULT_DRAIN_DELAY_SECONDS = 5
# A longer delay only takes time from vLLM's drain, as both share the pod's grace period (render/engine.py).
MAX_DRAIN_DELAY_SECONDS = 60


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    server_image: str = DEFAULT_SERVER_IMAGE
    # The agent ships in the server image (image/ adds it beside vLLM), so by default both containers share one.
    agent_image: str = DEFAULT_SERVER_IMAGE
    server_service_account: str = DEFAULT_SERVICE_ACCOUNT
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    peering: str | None = None  # None: standalone, a single operator replica
    # Among replicas in one peering only the highest priority works; equal ones would all work, so by default each
    # replica draws its own at random (kopf pauses the others until the active one's peering record goes stale).
    peering_priority: int | None = None
    resync_seconds: float = 60.0  # how often every ModelServer is reconciled even without events (drift, Secrets)
    # How long a model cache's claim may stay unbound before it is reported (ModelCacheUnbound).
    model_cache_unbound_seconds: float = 600.0
    # How long a terminating server pod keeps serving before vLLM gets SIGTERM (its preStop hook; 0: none), so that
    # Services, gateways and the endpoint picker stop routing to it before vLLM refuses new requests.
    drain_delay_seconds: int = DEFAULT_DRAIN_DELAY_SECONDS
    kubeconfig: str | None = None  # None: in-cluster service account, else $KUBECONFIG / ~/.kube/config
    kernel_configs_dir: str | None = None  # a folder laid out like moelora.kernels' configs/; None: the bundled one
    # kopf's health endpoint for the pod's liveness probe, e.g. http://0.0.0.0:8080/healthz; None: not served.
    liveness_endpoint: str | None = None
    # The port of the operator's Prometheus /metrics (the chart's operator.metricsPort); None: not served.
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    # What ModelServer and LoRAAdapter authors may pick (policy.py judges them; the chart's `policy` values).
    # Image globs (`*` matches anything, `/` included); empty: only server_image.
    allowed_images: tuple[str, ...] = ()
    # ServiceAccount names; empty: only server_service_account.
    allowed_service_accounts: tuple[str, ...] = ()
    # S3 endpoint URLs (scheme://host[:port]) adapters may name besides their server's own; empty: none besides it.
    allowed_s3_endpoints: tuple[str, ...] = ()
    # Bucket globs adapters may read; empty: any bucket their credentials reach.
    allowed_s3_buckets: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from MOELORA_* variables; unset or empty ones keep their defaults."""
        env = os.environ if env is None else env
        server_image = env.get("MOELORA_SERVER_IMAGE") or DEFAULT_SERVER_IMAGE
        resync = env.get("MOELORA_RESYNC_SECONDS") or ""
        try:
            resync_seconds = float(resync) if resync else 60.0
        except ValueError:
            raise ValueError(f"MOELORA_RESYNC_SECONDS must be a number of seconds, got {resync!r}") from None
        if resync_seconds <= 0:
            raise ValueError(f"MOELORA_RESYNC_SECONDS must be positive, got {resync!r}")
        return cls(
            server_image=server_image,
            agent_image=env.get("MOELORA_AGENT_IMAGE") or server_image,
            server_service_account=env.get("MOELORA_SERVER_SERVICE_ACCOUNT") or DEFAULT_SERVICE_ACCOUNT,
            namespaces=tuple(ns.strip() for ns in (env.get("MOELORA_NAMESPACES") or "").split(",") if ns.strip()),
            peering=(env.get("MOELORA_PEERING") or "").strip() or None,
            peering_priority=_optional_int(env, "MOELORA_PEERING_PRIORITY"),
            resync_seconds=resync_seconds,
            drain_delay_seconds=_drain_delay(env),
            kubeconfig=env.get("KUBECONFIG") or None,
            kernel_configs_dir=env.get("MOELORA_KERNEL_CONFIGS_DIR") or None,
            liveness_endpoint=_liveness_endpoint(env),
            metrics_port=_optional_int(env, "MOELORA_METRICS_PORT"),
            allowed_images=_list(env, "MOELORA_ALLOWED_IMAGES"),
            allowed_service_accounts=_list(env, "MOELORA_ALLOWED_SERVICE_ACCOUNTS"),
            allowed_s3_endpoints=tuple(_endpoint(url) for url in _list(env, "MOELORA_ALLOWED_S3_ENDPOINTS")),
            allowed_s3_buckets=_list(env, "MOELORA_ALLOWED_S3_BUCKETS"),
        )


def _list(env: Mapping[str, str], key: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(item.strip() for item in (env.get(key) or "").split(",") if item.strip())


def _endpoint(url: str) -> str:
    """An endpoint URL as policy.py compares it: scheme://host[:port], lowercase, nothing after."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path.strip("/") or parsed.query:
        raise ValueError(f"MOELORA_ALLOWED_S3_ENDPOINTS: {url!r} is not scheme://host[:port]")
    return f"{parsed.scheme}://{parsed.netloc.lower()}"


def _optional_int(env: Mapping[str, str], key: str) -> int | None:
    value = (env.get(key) or "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {value!r}") from None


def _drain_delay(env: Mapping[str, str]) -> int:
    value = _optional_int(env, "MOELORA_DRAIN_DELAY_SECONDS")
    if value is None:
        return DEFAULT_DRAIN_DELAY_SECONDS
    if not 0 <= value <= MAX_DRAIN_DELAY_SECONDS:
        raise ValueError(
            f"MOELORA_DRAIN_DELAY_SECONDS must be whole seconds from 0 to {MAX_DRAIN_DELAY_SECONDS}, got {value}"
        )
    return value


def _liveness_endpoint(env: Mapping[str, str]) -> str | None:
    value = (env.get("MOELORA_LIVENESS_ENDPOINT") or "").strip()
    if not value:
        return None
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
        raise ValueError(f"MOELORA_LIVENESS_ENDPOINT must be http://host:port/path, got {value!r}")
    return value
