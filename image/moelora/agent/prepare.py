"""Preparing one adapter version on a worker thread: policy, credentials, listing, checks, download, validation.

The cache's bookkeeping lives here too (the versions in use, and those in flight on workers, are never evicted),
since downloads are what fill the cache; the agent's loop tells it what vLLM serves and which downloads it has
collected.
"""

from __future__ import annotations

import pathlib
import shutil
import threading
from typing import Any, Protocol

from moelora.agent import peft_moe
from moelora.agent.cache import AdapterCache
from moelora.agent.errors import AdapterError
from moelora.agent.fetch import fetch, read_config_object
from moelora.agent.metrics import Metrics
from moelora.agent.reconcile import Desired
from moelora.agent.settings import Settings
from moelora.agent.source import (
    ClientConfig,
    Credentials,
    check_allowed,
    check_listing,
    list_source,
    make_client,
    parse_s3_uri,
)
from moelora.agent.validate import AdapterInfo, Limits, check_config, parse_config, validate
from moelora.api import FailureReason


class SecretReader(Protocol):
    def read_secret(self, *, name: str) -> dict[str, str] | None: ...


class Preparer:
    def __init__(
        self, *, settings: Settings, limits: Limits, cache: AdapterCache, kube: SecretReader, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.limits = limits
        self.cache = cache
        self.kube = kube
        self.metrics = metrics
        self.secrets: frozenset[str] = frozenset()  # values to redact from anything published (replaced, not mutated)
        self._clients: dict[ClientConfig, Any] = {}
        self._lock = threading.Lock()
        self._protected: set[str] = set()  # versions vLLM serves or records hold: never evicted
        self._inflight: set[str] = set()  # versions downloaded by workers, not yet collected by the loop

    def protect(self, versions: set[str]) -> None:
        with self._lock:
            self._protected = versions

    def release(self, version: str) -> None:
        """The loop has collected this version's download: only protection keeps it now."""
        with self._lock:
            self._inflight.discard(version)

    def prepare(self, item: Desired, known_bad: AdapterError | None) -> tuple[str, pathlib.Path, AdapterInfo]:
        """(version, the directory vLLM loads, what the files say); raises the adapter's AdapterError or a
        TransientError. `known_bad`: the verdict on the version judged last, not downloaded again if unchanged."""
        source = item.spec.source
        check_allowed(
            source,
            server_endpoint=self.settings.server_s3_endpoint,
            allowed_endpoints=self.settings.allowed_s3_endpoints,
            allowed_buckets=self.settings.allowed_s3_buckets,
        )
        credentials = None
        if source.credentials_secret is not None:
            data = self.kube.read_secret(name=source.credentials_secret.name)
            if data is None:
                raise AdapterError(
                    FailureReason.SECRET_NOT_FOUND,
                    f"Secret {source.credentials_secret.name!r} not found (or not readable)",
                )
            self.secrets = self.secrets | {v for v in data.values() if v}
            credentials = Credentials.from_secret(data, secret_name=source.credentials_secret.name)
        client = self._client(
            ClientConfig(endpoint_url=source.endpoint_url, region=source.region, credentials=credentials)
        )
        listing = list_source(client, location=parse_s3_uri(source.uri))
        if known_bad is not None and known_bad.version == listing.version:
            raise known_bad
        try:
            check_listing(listing, max_bytes=min(self.settings.max_adapter_bytes, self.settings.cache_bytes))
            if not (self.settings.cache_dir / listing.version).is_dir():  # judge the config before the weights
                config = parse_config(read_config_object(client=client, listing=listing))
                check_config(config, self.limits)
                peft_moe.plan(config, base_model=self.limits.base_model)  # an unservable expert format fails here
            with self._lock:
                self._inflight.add(listing.version)
                present = (self.settings.cache_dir / listing.version).is_dir()
                self.cache.evict(keep=self._protected | self._inflight, room_for=0 if present else listing.total_bytes)
            counter = self.metrics.downloaded.labels(item.name)
            path = fetch(
                client=client,
                listing=listing,
                cache_dir=self.settings.cache_dir,
                pin=item.spec.pin,
                on_bytes=counter.inc,
            )
            try:
                info = validate(path, self.limits)
                path = peft_moe.servable(path, base_model=self.limits.base_model)  # vLLM loads this one
            except AdapterError:
                shutil.rmtree(path, ignore_errors=True)  # never served: no reason to keep it
                raise
        except AdapterError as error:
            error.version = listing.version
            raise
        return listing.version, path, info

    def _client(self, config: ClientConfig) -> Any:
        with self._lock:
            client = self._clients.get(config)
            if client is None:  # boto3 clients are thread-safe; creating one costs ~10 ms and some memory
                if len(self._clients) >= 64:  # rotated credentials leave old entries behind: start afresh
                    self._clients.clear()
                client = self._clients[config] = make_client(config, max_connections=self.settings.download_workers * 4)
        return client
