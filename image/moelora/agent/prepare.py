"""Preparing one adapter version on a worker thread: policy, credentials, listing, checks, download, validation.

The cache's bookkeeping lives here too (the versions in use, and those in flight on workers, are never evicted;
a download reserves its listing's bytes before it starts, so downloads in flight never take the cache over its
limit, nor over what its disk has free), since downloads are what fill the cache; the agent's loop tells it what
vLLM serves and which downloads it has collected. So do the guards of one adapter's S3 trouble (store/guard.py):
a cap per endpoint, deadlines, a rate floor, and cancellation when the adapter is deleted or changed.

A new version refused by the checks is not the adapter's end when an earlier one was served (store/last_good.py):
the result is then that earlier version, with the refusal beside it (UpdateRejected).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shutil
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from moelora.agent.check import peft_moe
from moelora.agent.check.validate import AdapterInfo, Limits, check_config, parse_config, validate
from moelora.agent.errors import AdapterError, TransientError
from moelora.agent.reconcile import Desired
from moelora.agent.report.metrics import Metrics
from moelora.agent.settings import Settings
from moelora.agent.store.cache import AdapterCache
from moelora.agent.store.fetch import DEFAULT_TRANSFER, fetch, read_config_object
from moelora.agent.store.guard import Deferred, EndpointGates, Slot, Watch, bounded
from moelora.agent.store.last_good import LastGood, Served
from moelora.agent.store.source import (
    ClientConfig,
    Credentials,
    check_allowed,
    check_listing,
    list_source,
    make_client,
    parse_s3_uri,
)
from moelora.api import FailureReason

logger = logging.getLogger(__name__)


class SecretReader(Protocol):
    def read_secret(self, *, name: str) -> dict[str, str] | None: ...


@dataclasses.dataclass(frozen=True)
class Prepared:
    version: str
    path: pathlib.Path  # the directory vLLM loads
    info: AdapterInfo
    rejected: AdapterError | None = None  # a newer version refused; this is the last good one instead


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a worker hands back to the loop."""

    uid: str
    spec_hash: str
    refresh: bool  # a periodic re-check (of a loaded or failed adapter), not a first preparation
    prepared: Prepared | None = None
    error: Exception | None = None


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
        self.last_good = LastGood(settings.cache_dir)
        self.gates = EndpointGates(per_endpoint=settings.endpoint_workers)
        self.transfer_config = DEFAULT_TRANSFER
        self._clients: dict[ClientConfig, Any] = {}
        self._lock = threading.Lock()
        self._protected: set[str] = set()  # versions vLLM serves or records hold: never evicted
        self._inflight: set[str] = set()  # versions downloaded by workers, not yet collected by the loop
        self._reserved: dict[str, int] = {}  # version -> bytes its download may write
        self._watches: dict[str, tuple[str, Watch]] = {}  # uid -> (spec hash, its preparation's watch)
        # uid -> (spec hash, watch) of preparations over whose calls still run (given up on at a deadline)
        self._lingering: dict[str, list[tuple[str, Watch]]] = {}
        # uid -> (spec hash, bytes, room then) of its last CacheFull refusal
        self._no_room: dict[str, tuple[str, int, int]] = {}
        self._room_checked = float("-inf")

    def protect(self, versions: set[str]) -> None:
        with self._lock:
            self._protected = versions

    def release(self, version: str) -> None:
        """The loop has collected this version's download: only protection keeps it now."""
        with self._lock:
            self._inflight.discard(version)

    def reserved_bytes(self) -> int:
        with self._lock:
            return sum(self._reserved.values())

    def refused_with_room(self, *, now: float) -> set[str]:
        """The adapters refused for room that fit now, the room having grown since (a delete, a failed download):
        their retry need not wait out its backoff. Walks the cache at most once a poll, and only while any wait."""
        with self._lock:
            waiting = dict(self._no_room)
        if not waiting or now < self._room_checked + self.settings.poll_seconds:
            return set()
        self._room_checked = now
        room = self._room()
        return {uid for uid, (_, size, then) in waiting.items() if then < room and size <= room}

    def room_needed(self, uids: Collection[str]) -> int:
        """Bytes the cache lacks, once eviction has run, for the adapters `uids` last refused for room."""
        with self._lock:
            wanted = sum(self._no_room[uid][1] for uid in uids if uid in self._no_room)
        return wanted - self._room()

    def cancel_stale(self, wanted: Mapping[str, str]) -> list[str]:
        """Cancel preparations of adapters no longer desired (uid -> spec hash), or desired with another spec, and
        the calls their earlier preparations gave up on: their sockets close, their endpoint slots free. Returns the
        uids of the preparations cancelled."""
        with self._lock:
            stale = [uid for uid, (spec_hash, _) in self._watches.items() if wanted.get(uid) != spec_hash]
            for uid in stale:
                self._watches[uid][1].cancel()
            for uid, held in self._lingering.items():
                for spec_hash, watch in held:
                    if wanted.get(uid) != spec_hash:
                        watch.cancel()
        return stale

    def prepare(self, item: Desired, known_bad: AdapterError | None) -> Prepared:
        """The version to serve; raises the adapter's AdapterError, a TransientError, Deferred (its endpoint is
        busy) or Cancelled. `known_bad`: the verdict on the version judged last, not downloaded again if unchanged."""
        slot = self.gates.try_slot(item.spec.source.endpoint_url)
        if slot is None:
            raise Deferred(stuck=self.gates.stuck(item.spec.source.endpoint_url))
        watch = Watch(min_rate=self.settings.min_bytes_per_second, window=self.settings.rate_window_seconds)
        with self._lock:
            self._watches[item.uid] = (item.spec_hash, watch)
        try:
            return self._prepare(item, known_bad, watch, slot)
        except AdapterError as error:
            served = self.last_good.get(item.uid)
            if error.version is None or served is None or served.version == error.version:
                raise
            path = pathlib.Path(served.path)
            return Prepared(
                served.version, path, validate(self.settings.cache_dir / served.version, self.limits), error
            )
        finally:
            with self._lock:
                if self._watches.get(item.uid, (None, None))[1] is watch:
                    del self._watches[item.uid]
                self._lingering.setdefault(item.uid, []).append((item.spec_hash, watch))
            slot.when_free(lambda: self._settled(item.uid, watch))
            slot.leave()

    def _settled(self, uid: str, watch: Watch) -> None:
        """No call of that preparation runs any more: nothing of it is left to cancel."""
        with self._lock:
            held = [entry for entry in self._lingering.get(uid, []) if entry[1] is not watch]
            if held:
                self._lingering[uid] = held
            else:
                self._lingering.pop(uid, None)

    def _prepare(self, item: Desired, known_bad: AdapterError | None, watch: Watch, slot: Slot) -> Prepared:
        source = item.spec.source
        check_allowed(
            source,
            server_endpoint=self.settings.server_s3_endpoint,
            allowed_endpoints=self.settings.allowed_s3_endpoints,
            allowed_buckets=self.settings.allowed_s3_buckets,
        )
        refused = self._no_room.get(item.uid)
        if refused is not None and refused[0] == item.spec_hash and self._room() < refused[1]:
            # S3 is not asked while the answer cannot matter: a 5xx on the way would replace CacheFull in the status
            raise TransientError(
                f"the adapter cache still has no room for {refused[1]} bytes", reason=FailureReason.CACHE_FULL
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
        location = parse_s3_uri(source.uri)
        watch.start(f"listing {location}", seconds=self.settings.list_timeout_seconds)
        listing = self._bounded(lambda: list_source(client, location=location), watch, slot)
        if known_bad is not None and known_bad.version == listing.version:
            raise known_bad
        version = listing.version
        try:
            check_listing(listing, max_bytes=min(self.settings.max_adapter_bytes, self.settings.cache_bytes))
            if not (self.settings.cache_dir / version).is_dir():  # judge the config before the weights
                raw = self._bounded(lambda: read_config_object(client=client, listing=listing), watch, slot)
                config = parse_config(raw)
                check_config(config, self.limits)
                peft_moe.plan(config, base_model=self.limits.base_model)  # an unservable expert format fails here
            try:
                self._reserve(version, listing.total_bytes)
            except TransientError:
                self._no_room[item.uid] = (item.spec_hash, listing.total_bytes, self._room())
                raise
            self._no_room.pop(item.uid, None)
            try:
                watch.start(f"downloading {location}", seconds=self.settings.download_timeout_seconds)
                path = fetch(
                    client=client,
                    listing=listing,
                    cache_dir=self.settings.cache_dir,
                    pin=item.spec.pin,
                    on_bytes=self.metrics.downloaded.labels(item.name).inc,
                    watch=watch,
                    transfer_config=self.transfer_config,
                    owner=item.uid,
                )
            finally:
                with self._lock:
                    self._reserved.pop(version, None)
            try:
                info = validate(path, self.limits)
                path = peft_moe.servable(path, base_model=self.limits.base_model)  # vLLM loads this one
            except AdapterError:
                shutil.rmtree(path, ignore_errors=True)  # never served: no reason to keep it
                raise
        except AdapterError as error:
            error.version = version
            self.release(version)
            raise
        except BaseException:
            self.release(version)
            raise
        return Prepared(version, path, info)

    def prune_partials(self, desired: set[str]) -> list[str]:
        """Drop the partial downloads of adapters not in `desired` (uids), but none a worker is on, and what was
        remembered of their cache refusals."""
        with self._lock:  # _reserve takes it too: a download cannot start on a partial being removed
            for uid in set(self._no_room) - desired:
                self._no_room.pop(uid, None)
            removed = self.cache.prune_partials(owners=desired, busy=self._inflight | set(self._reserved))
        for version in removed:
            logger.info("removed the partial download %s: its adapter is no longer desired", version)
        return removed

    def remember(self, uid: str, *, version: str, path: str) -> None:
        """vLLM serves this version of the adapter: the fallback should a later version be refused."""
        self.last_good.remember(uid, Served(version=version, path=path))

    def _bounded(self, call: Callable[[], Any], watch: Watch, slot: Slot) -> Any:
        slot.hold()  # the endpoint's slot stays taken until the call itself ends, even one given up on
        return bounded(call, watch=watch, on_exit=slot.drop)

    def _reserve(self, version: str, size: int) -> None:
        """Room for `size` more bytes within the cache's limit (evicting what no one uses), or CacheFull."""
        with self._lock:
            if version in self._reserved:  # another adapter with the same files is downloading them now
                raise Deferred()
            self._inflight.add(version)
            if (self.settings.cache_dir / version).is_dir():
                return
            keep = self._protected | self._inflight | self.last_good.versions()
            others = set(self._reserved) | {version}
            pending = sum(self._reserved.values()) + size
            budget = self.cache.budget()  # eviction frees disk as much as it shrinks the cache: asked once
            self.cache.evict(keep=keep, room_for=pending, reserved=others, limit=budget)
            used = self.cache.used_bytes(reserved=others)
            if used + pending > budget:
                short = f"limit {budget}"
                if budget < self.cache.limit_bytes:
                    short = f"its disk has room for only {budget} in all (limit {self.cache.limit_bytes})"
                raise TransientError(
                    f"the adapter cache has no room for {size} bytes: {used} on disk and "
                    f"{pending - size} reserved by downloads in flight, {short}",
                    reason=FailureReason.CACHE_FULL,
                )
            self._reserved[version] = size

    def _room(self) -> int:
        """Bytes a reservation could have now, once everything eviction may remove is removed."""
        with self._lock:
            held = self._protected | self._inflight | self.last_good.versions() | set(self._reserved)
            kept = sum(e.size for e in self.cache.entries() if e.version in held)
            return self.cache.budget() - kept - sum(self._reserved.values())

    def _client(self, config: ClientConfig) -> Any:
        with self._lock:
            client = self._clients.get(config)
            if client is None:  # boto3 clients are thread-safe; creating one costs ~10 ms and some memory
                if len(self._clients) >= 64:  # rotated credentials leave old entries behind: start afresh
                    self._clients.clear()
                client = self._clients[config] = make_client(
                    config,
                    max_connections=self.settings.download_workers * 4,
                    read_timeout=self.settings.s3_read_timeout_seconds,
                )
        return client
