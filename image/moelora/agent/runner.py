"""The agent's loop: take the plan (reconcile.plan) and execute it against S3, the cache, vLLM and Kubernetes.

One thread owns the records and talks to vLLM and Kubernetes; downloads run in a worker pool and hand their outcome
back through a queue. The loop wakes on any change (watch event, finished download) or every poll_seconds.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from moelora.agent import reconcile
from moelora.agent.check import peft_moe
from moelora.agent.check.validate import AdapterInfo, Limits
from moelora.agent.errors import AdapterError, TransientError, quote, redact
from moelora.agent.prepare import Outcome, Prepared, Preparer
from moelora.agent.reconcile import Desired, LoadedAdapter, Record, Stage
from moelora.agent.report.metrics import Metrics
from moelora.agent.report.publish import StatusPublisher
from moelora.agent.report.readiness import ReadyGate
from moelora.agent.report.usage import LoadSampler
from moelora.agent.serve import foreign, holding, loader, ondemand
from moelora.agent.serve.vllm import AdapterPoller, VllmClient
from moelora.agent.settings import Settings
from moelora.agent.store.cache import AdapterCache
from moelora.agent.store.guard import Cancelled, Deferred
from moelora.api import FailureReason, ReplicaAdapterState

logger = logging.getLogger(__name__)


class StatusWriter(Protocol):
    def read_secret(self, *, name: str) -> dict[str, str] | None: ...
    def patch_replica(self, *, name: str, pod: str, state: ReplicaAdapterState, info: AdapterInfo | None) -> bool: ...
    def patch_on_demand_load(self, *, name: str, pod: str, load: float | None) -> bool: ...
    def create_pod_event(self, *, pod: str, pod_uid: str, reason: str, message: str, type: str = "Warning") -> None: ...


class DesiredSource(Protocol):
    synced: threading.Event

    def snapshot(self) -> list[Desired]: ...


class Agent:
    def __init__(
        self,
        *,
        settings: Settings,
        kube: StatusWriter,
        desired: DesiredSource,
        vllm: VllmClient,
        metrics: Metrics,
        monotonic: Callable[[], float] = time.monotonic,
        catalogue: Callable[[], list[Desired]] | None = None,
    ) -> None:
        """`desired`: what this pod holds (with placement, its assignments); `catalogue`: what a request may name."""
        self.settings, self.kube, self.vllm, self.metrics = settings, kube, vllm, metrics
        self.desired_source, self.monotonic = desired, monotonic
        self.limits = Limits(
            base_model=settings.base_model,
            max_rank=settings.max_lora_rank,
            target_modules=settings.target_modules,
            max_bytes=settings.max_adapter_bytes,
            base_config=settings.base_model_config,
        )
        self.cache = AdapterCache(root=settings.cache_dir, limit_bytes=settings.cache_bytes)
        self.records: dict[str, Record] = {}
        self.busy: dict[str, concurrent.futures.Future[None]] = {}
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.wake = threading.Event()
        self.resolutions = ondemand.Resolutions(wake=self.wake.set)
        self.stopping = threading.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(settings.download_workers, thread_name_prefix="fetch")
        self.status_pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="status")
        self.vllm_up = False
        self.poller = AdapterPoller(vllm, poll=settings.poll_seconds)
        self.usage = LoadSampler(window_seconds=settings.load_window_seconds) if settings.placement else None
        self.gate = ReadyGate(wait_seconds=settings.ready_wait_seconds, metrics=metrics)
        self.last_loop = monotonic()
        self.next_resync = monotonic() + settings.resync_seconds
        self.preparer = Preparer(settings=settings, limits=self.limits, cache=self.cache, kube=kube, metrics=metrics)
        self._cache_changed = True
        self._prune_partials = True  # the first pass drops partials of adapters deleted while the agent was down
        self.publisher = StatusPublisher(kube=kube, pod=settings.pod_name, pool=self.status_pool)
        self.loader = loader.Loader(
            vllm=vllm,
            metrics=metrics,
            cache=self.cache,
            preparer=self.preparer,
            fail=self._fail,
            monotonic=monotonic,
            checked=self.resolutions.serve,
            withdrawn=self.resolutions.withdraw,
        )
        self.holding = holding.Holding(
            model_server=settings.model_server,
            cache_dir=settings.cache_dir,
            catalogue=catalogue or desired.snapshot,
            resolutions=self.resolutions,
            metrics=metrics,
            preparer=self.preparer,
            cache=self.cache,
        )
        self.foreign = foreign.Reporter(
            events=kube,
            metrics=metrics,
            pod=settings.pod_name,
            pod_uid=settings.pod_uid,
            pool=self.status_pool,
            own=self.holding.from_cache,
        )

    def run(self) -> None:
        try:
            self.settings.cache_dir.mkdir(parents=True, exist_ok=True)
            self.cache.remove_temporaries()
            while not self.stopping.is_set():
                self.wake.wait(self.gate.next_wake(now=self.monotonic(), poll=self.settings.poll_seconds))
                self.wake.clear()
                try:
                    self.step()
                except Exception:
                    logger.exception("reconcile step failed")
                self.last_loop = self.monotonic()
        finally:  # here, not in stop(): a signal handler runs stop() inside a step that still submits its work
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.status_pool.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def alive(self) -> bool:
        # A vLLM call may take its timeout (60 s) times its attempts: only a loop silent for longer is stuck.
        return self.monotonic() - self.last_loop < max(300.0, 10 * self.settings.poll_seconds)

    def step(self) -> None:
        """One pass: collect finished downloads, look at vLLM, plan, execute, publish status."""
        now = self.monotonic()
        self._collect()
        if not self.desired_source.synced.is_set():
            self.gate.update(vllm_up=False, unsettled=[], now=now)
            return
        placed = self.desired_source.snapshot()
        loaded = self._vllm_adapters()
        desired = self.holding.desired(placed, now=now, loaded=loaded, records=self.records, busy=self.busy)
        by_uid = {d.uid: d for d in desired}
        if not self.records and not self.busy:  # first pass after a (re)start: markers of deleted adapters go
            self.preparer.last_good.prune(set(by_uid))
        for uid in self.preparer.cancel_stale({d.uid: d.spec_hash for d in desired}):
            logger.info("cancelled the preparation of %s: deleted or changed", uid)
        self._reconcile_loaded_stage(desired, loaded)
        if now >= self.next_resync:
            self.next_resync = now + self.settings.resync_seconds
            self._resync(desired)
        plan = reconcile.plan(
            desired=desired,
            records=self.records,
            loaded=loaded,
            busy=set(self.busy),
            now=now,
            roomy=self.preparer.refused_with_room(now=now),
        )
        for uid, winner in plan.conflicts.items():
            self._conflict(by_uid[uid], winner, now)
        for uid in plan.forget:
            self._forget(uid)
        if self._prune_partials:  # deleted adapters' partials, kept by a kill or a transient failure
            self._prune_partials = False
            self.preparer.prune_partials(set(by_uid))
        for name in plan.unload:
            if self.loader.unload(name) and loaded is not None:
                del loaded[name]
        for name in plan.foreign:
            if self.loader.unload(name) and loaded is not None:
                self.foreign.unloaded(name=name, path=loaded.pop(name).path)
        self._protect(loaded)  # before the downloads start: they may evict what was just unloaded
        for uid in plan.prepare:
            self._start_prepare(by_uid[uid], refresh=False)
        for uid in plan.adopt:  # files handed to vLLM's resolver were loaded now, as far as anyone waited
            self.loader.mark_loaded(self.records[uid], observe=self.records[uid].handed_at is not None)
        for load in plan.load:
            self._load(self.records[load.uid], load, loaded)
        if self.usage is not None:  # only placement's copiesMode Auto reads the load
            self.usage.update(fetch=self.vllm.metrics_text, records=self.records.values(), now=now)
        self.holding.answer(desired, self.records)
        # Readiness first: publishing writes to the Kubernetes API, and a pod whose vLLM died should not wait on that.
        self.gate.update(
            vllm_up=self.vllm_up, unsettled=reconcile.unsettled(desired=placed, records=self.records), now=now
        )
        # Only placed adapters have a status entry here: the operator keeps only the assigned pods' entries.
        self.publisher.publish(placed, self.records)

    @property
    def is_ready(self) -> bool:
        return self.gate.open

    # ---- vLLM ----

    def _load(self, record: Record, load: reconcile.Load, loaded: dict[str, LoadedAdapter] | None) -> None:
        if not load.inplace and self.resolutions.waiting(load.served_name):
            self.loader.load(record, load, current=None, hand_over=True)
            return
        if record.handed_at is not None and self.monotonic() - record.handed_at < holding.HAND_OVER_SECONDS:
            return  # vLLM is registering what its resolver got: the next look at /v1/models adopts it
        self.loader.load(record, load, current=loaded.get(load.served_name) if loaded is not None else None)

    def _vllm_adapters(self) -> dict[str, LoadedAdapter] | None:
        adapters = self.poller.poll()
        if adapters is None and self.vllm_up:
            logger.warning("vLLM is not answering; adapters will be registered again once it is back")
        self.vllm_up = adapters is not None
        return adapters

    def _reconcile_loaded_stage(self, desired: list[Desired], loaded: dict[str, LoadedAdapter] | None) -> None:
        """A record says Loaded only while vLLM really serves its files (a vLLM restart forgets them all)."""
        for record in self.records.values():
            if record.stage is not Stage.LOADED:
                continue
            current = loaded.get(record.served_name) if loaded is not None else None
            if current is not None and current.path != record.path and record.path is not None:
                self.foreign.replaced(name=record.served_name, path=current.path, own=record.path)
            if current is None or current.path != record.path:
                record.stage = Stage.READY
                self.metrics.loaded.labels(record.name, record.served_name).set(0)

    # ---- records ----

    def _fail(self, record: Record, reason: FailureReason, message: str, *, permanent: bool) -> None:
        message = redact(message, self.preparer.secrets)
        if not message.isprintable():  # values are quoted where messages are made; this catches any that were not
            message = quote(message, limit=2000)
        record.fail(reason, message, permanent=permanent, now=self.monotonic())
        self.metrics.failures.labels(record.name, reason.value).inc()
        self.metrics.loaded.labels(record.name, record.served_name).set(0)
        log = logger.warning if record.permanent else logger.info
        log(
            "adapter %s failed (%s%s): %s",
            record.name,
            reason.value,
            ", will retry" if record.retrying else "",
            message,
        )

    def _conflict(self, item: Desired, winner: str, now: float) -> None:
        record = self.records.get(item.uid)
        if record is not None and record.conflict_with == winner:
            return
        if record is None:
            record = self.records[item.uid] = Record(
                uid=item.uid, name=item.name, served_name=item.served_name, spec_hash=item.spec_hash
            )
        record.conflict_with = winner
        record.attempts = 0
        self._fail(
            record,
            FailureReason.NAME_CONFLICT,
            f"served name {item.served_name!r} is already taken by the older adapter {winner!r}",
            permanent=True,
        )

    def _forget(self, uid: str) -> None:
        record = self.records.pop(uid)
        self.publisher.forget(uid)
        self.preparer.last_good.forget(uid)
        self._prune_partials = True
        future = self.busy.pop(uid, None)
        if future is not None:
            future.cancel()
        self.metrics.forget(adapter=record.name, served_name=record.served_name)

    def _resync(self, desired: list[Desired]) -> None:
        """Re-check loaded and failed adapters against S3: new files are loaded in place, and an outside fix (a
        Secret created, files uploaded or corrected) cures a failure without any change to the LoRAAdapter.
        Files already judged bad are not downloaded again (same listing, same verdict)."""
        for item in desired:
            record = self.records.get(item.uid)
            if record is None or item.uid in self.busy or record.spec_hash != item.spec_hash:
                continue
            if record.stage is Stage.LOADED or (record.stage is Stage.FAILED and record.conflict_with is None):
                self._start_prepare(item, refresh=True)

    # ---- preparation (worker threads) ----

    def _start_prepare(self, item: Desired, *, refresh: bool) -> None:
        record = self.records.get(item.uid)
        if record is None or record.spec_hash != item.spec_hash or record.served_name != item.served_name:
            old = record
            record = self.records[item.uid] = Record(
                uid=item.uid, name=item.name, served_name=item.served_name, spec_hash=item.spec_hash
            )
            if old is not None and old.served_name == item.served_name and old.stage is Stage.LOADED:
                # vLLM keeps serving these files while the new spec is checked: the status says Loaded, as it is
                record.stage, record.checking = Stage.LOADED, True
                record.path, record.version, record.info = old.path, old.version, old.info
                record.loaded_at, record.serving = old.loaded_at, old.serving
        if not refresh and record.stage is not Stage.LOADED:
            record.stage = Stage.PREPARING
            record.conflict_with = None
            record.started = self.monotonic()
        known_bad = None
        if record.stage is Stage.FAILED and record.failed_version and record.reason is not None:
            known_bad = AdapterError(record.reason, record.message or "")
            known_bad.version = record.failed_version
        elif record.rejected is not None:
            known_bad = AdapterError(record.rejected[1], record.rejected[2])
            known_bad.version = record.rejected[0]
        self.busy[item.uid] = self.pool.submit(self._prepare, item, refresh, known_bad)

    def _prepare(self, item: Desired, refresh: bool, known_bad: AdapterError | None) -> None:
        """List, check, download and validate one adapter; the outcome goes back to the loop (never raises)."""
        try:
            prepared = self.preparer.prepare(item, known_bad)
            outcome = Outcome(uid=item.uid, spec_hash=item.spec_hash, refresh=refresh, prepared=prepared)
        except Exception as error:  # noqa: BLE001 - every failure becomes this adapter's, and only its
            outcome = Outcome(uid=item.uid, spec_hash=item.spec_hash, refresh=refresh, error=error)
        self.outcomes.put(outcome)
        self.wake.set()

    def _collect(self) -> None:
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                return
            self.busy.pop(outcome.uid, None)
            self._cache_changed = True
            prepared = outcome.prepared
            if prepared is not None:
                self.preparer.release(prepared.version)
            record = self.records.get(outcome.uid)
            if record is None or record.spec_hash != outcome.spec_hash or isinstance(outcome.error, Cancelled):
                self._prune_partials = True  # a partial it kept (a transient failure) is no one's now
                continue  # deleted or changed while downloading: the plan starts over
            if isinstance(outcome.error, Deferred):
                if record.stage is Stage.LOADED:  # still served: its check waits for the next resync or retry_at
                    record.retry_at = self.monotonic() + (5.0 if outcome.error.stuck else 0.2)
                    continue
                if outcome.error.stuck:  # its endpoint hangs: say so rather than wait in silence
                    why = "every download slot of its S3 endpoint is held by a call that hangs"
                    self._fail(record, FailureReason.ENDPOINT_UNREACHABLE, why, permanent=False)
                else:  # busy: another turn once a worker finishes, its last failure (if any) still shown
                    record.stage = Stage.FAILED if record.reason is not None else Stage.PENDING
                    record.retry_at = self.monotonic() + 0.2
                continue
            if outcome.error is not None:
                error = outcome.error
                if isinstance(error, AdapterError) and error.version is not None:
                    self.preparer.release(error.version)
                if record.stage is Stage.LOADED and (outcome.refresh or isinstance(error, TransientError)):
                    # Serving what was checked before beats dropping it over a new problem (S3 down, files gone).
                    why = redact(str(error), self.preparer.secrets)
                    logger.info("re-checking adapter %s failed, keeping what is loaded: %s", record.name, why)
                    if record.checking:  # a changed spec is checked again with backoff, not only at the resync
                        record.attempts += 1
                        record.retry_at = self.monotonic() + min(60.0, 2.0 ** (record.attempts - 1))
                    continue
                record.checking = False
                if isinstance(error, AdapterError):
                    if outcome.refresh and error.reason is record.reason and error.version == record.failed_version:
                        continue  # the same verdict on the same files: nothing new to publish or count
                    self._fail(record, error.reason, error.message, permanent=True)
                    record.failed_version, record.info = error.version, error.facts
                elif isinstance(error, TransientError):
                    self._fail(record, error.reason, error.message, permanent=False)
                else:
                    logger.exception("unexpected error preparing %s", record.name, exc_info=error)
                    self._fail(record, FailureReason.LOAD_FAILED, f"{type(error).__name__}: {error}", permanent=False)
                continue
            if prepared is not None:
                if record.checking:  # the changed spec passed its check: its backoff starts afresh
                    record.checking, record.attempts = False, 0
                self._accept(record, prepared)

    def _accept(self, record: Record, prepared: Prepared) -> None:
        """A version to serve: the new one, or the last good one with the refusal of the new one beside it."""
        rejected = prepared.rejected
        refusal = (str(rejected.version), rejected.reason, rejected.message) if rejected else None
        if record.accept(prepared.version, str(prepared.path), prepared.info, refusal, now=self.monotonic()):
            assert rejected is not None
            message = redact(rejected.message, self.preparer.secrets)
            names = (record.name, rejected.version, prepared.version)
            logger.warning("adapter %s: version %s refused, keeps serving %s: %s", *names, message)
            self.metrics.failures.labels(record.name, FailureReason.UPDATE_REJECTED.value).inc()

    def _protect(self, loaded: dict[str, LoadedAdapter] | None) -> None:
        versions = {r.version for r in self.records.values() if r.version}
        if loaded is not None:
            versions |= {peft_moe.cache_version(a.path) for a in loaded.values()}
        self.preparer.protect(versions)
        if self._cache_changed:  # walking the cache is not free with hundreds of adapters: only after downloads
            self._cache_changed = False
            self.metrics.cache_bytes.set(self.cache.total_bytes())
        self.metrics.cache_reserved.set(self.preparer.reserved_bytes())
