"""The plan: what this pod must do so vLLM serves exactly its desired adapters. Pure; the runner executes it.

Inputs are the desired LoRAAdapters (from the watch), what the agent knows of each (a Record), and what vLLM
serves now (`/v1/models`), so an adapter vLLM lost in a restart is simply loaded again. Adapters sharing a served
name are resolved deterministically: the oldest wins, the others fail with NameConflict.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import hashlib
import json
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from moelora.agent.check.validate import AdapterInfo
from moelora.api import AdapterPhase, FailureReason, LoRAAdapterSpec, ReplicaAdapterState

_JITTER = random.Random()  # our own: the global generator's state belongs to whoever seeds it
# The served names of the agent's output checks (serve.loader's check_output): random after it, never a client's.
CANARY_PREFIX = "moelora-canary-"


@dataclasses.dataclass(frozen=True)
class LoadedAdapter:
    """An adapter vLLM serves now, as its `/v1/models` lists it."""

    name: str
    path: str
    parent: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Desired:
    """A LoRAAdapter this pod should serve, as the watch last saw it."""

    uid: str
    name: str
    created: str  # creationTimestamp, RFC 3339: orders name conflicts
    spec: LoRAAdapterSpec

    @property
    def served_name(self) -> str:
        return self.spec.served_name or self.name

    @functools.cached_property
    def spec_hash(self) -> str:
        """Changes whenever anything that decides the files or the name changes."""
        return hashlib.sha256(json.dumps(self.spec.to_wire(), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Desired:
        meta = obj.get("metadata", {})
        return cls(
            uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta['name']}"),
            name=meta["name"],
            created=str(meta.get("creationTimestamp") or ""),
            spec=LoRAAdapterSpec.model_validate(obj.get("spec", {})),
        )


class Stage(str, enum.Enum):
    PENDING = "Pending"  # known, nothing done yet
    PREPARING = "Preparing"  # listing, downloading, validating
    READY = "Ready"  # files validated in the cache, not (yet) in vLLM
    LOADED = "Loaded"  # vLLM serves it
    FAILED = "Failed"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Serving:
    """The files vLLM serves under a record's name since this agent loaded (or adopted) them."""

    version: str | None
    path: str
    info: AdapterInfo | None
    loaded_at: datetime.datetime | None


@dataclasses.dataclass(kw_only=True)
class Record:
    """What this agent knows of one adapter. Mutable; only the runner's loop changes it."""

    uid: str
    name: str
    served_name: str
    spec_hash: str
    stage: Stage = Stage.PENDING
    version: str | None = None
    path: str | None = None
    info: AdapterInfo | None = None
    reason: FailureReason | None = None
    message: str | None = None
    permanent: bool = False
    retrying: bool = False  # its last failure was transient: retried with backoff, even once it counts as failed
    attempts: int = 0
    retry_at: float = 0.0
    loaded_at: datetime.datetime | None = None
    started: float | None = None  # monotonic time the current preparation began (load duration)
    conflict_with: str | None = None  # the adapter that holds our served name
    failed_version: str | None = None  # the files a permanent failure was judged on: not downloaded again
    rejected: tuple[str, FailureReason, str] | None = None  # (version, reason, message) refused while serving another
    load: float | None = None  # requests in flight on this pod, on average (report/usage.py), while loaded
    serving: Serving | None = None  # what vLLM serves for it since the last load: an update refused later falls back
    checking: bool = False  # its spec changed while loaded: vLLM keeps the files until the new spec is checked
    handed_at: float | None = None  # monotonic time its files went to vLLM's resolver, which registers them itself

    def fail(
        self,
        reason: FailureReason,
        message: str,
        *,
        permanent: bool,
        now: float,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        max_attempts: int = 6,
    ) -> None:
        self.attempts += 1
        self.reason, self.message = reason, message
        # A transient failure that keeps coming back counts as failed for readiness, but is still retried.
        self.permanent = permanent or self.attempts >= max_attempts
        self.retrying = not permanent
        self.stage = Stage.FAILED
        # Jitter spreads the retries of many adapters that failed together (one endpoint down) over time.
        self.retry_at = now + min(max_backoff, backoff * 2 ** (self.attempts - 1)) * _JITTER.uniform(0.5, 1.0)

    def state(self) -> ReplicaAdapterState:
        """This pod's entry in the LoRAAdapter's status.replicas: Downloading only while a worker is on it."""
        phases = {
            Stage.PENDING: AdapterPhase.PENDING,
            Stage.PREPARING: AdapterPhase.DOWNLOADING,
            Stage.READY: AdapterPhase.PENDING,  # in the cache, waiting for vLLM
            Stage.LOADED: AdapterPhase.LOADED,
            # A transient failure waits for its retry (the reason says why); only a permanent one is Failed.
            Stage.FAILED: AdapterPhase.FAILED if self.permanent else AdapterPhase.PENDING,
        }
        phase = phases[self.stage]
        reason, message = (self.reason.value if self.reason else None, self.message)
        # A retry under way still says why the last attempt failed: the reason goes only once it succeeds.
        if self.stage is not Stage.FAILED and not (self.stage is Stage.PREPARING and self.retrying):
            reason = message = None
        rejected = self.rejected if self.stage is Stage.LOADED else None
        if rejected is not None:
            reason = FailureReason.UPDATE_REJECTED.value
            message = f"version {rejected[0]} refused ({rejected[1].value}): {rejected[2]}"
        return ReplicaAdapterState(
            loaded=self.stage is Stage.LOADED,
            state=phase,
            reason=reason,
            last_error=message,
            loaded_at=self.loaded_at if self.stage is Stage.LOADED else None,
            version=self.version if self.stage is Stage.LOADED else None,
            rejected_version=rejected[0] if rejected else None,
            load=self.load if self.stage is Stage.LOADED else None,
        )

    def accept(
        self, version: str, path: str, info: AdapterInfo, rejected: tuple[str, FailureReason, str] | None, *, now: float
    ) -> bool:
        """Files to serve (READY for the plan to load, unless vLLM serves them already); `rejected`: the newer
        version refused meanwhile. True when that refusal is news."""
        news = rejected is not None and rejected != self.rejected
        self.rejected = rejected
        if self.stage is Stage.LOADED and path == self.path:
            return news  # same files: nothing to do
        self.version, self.path, self.info = version, path, info
        self.failed_version = None
        self.stage = Stage.READY  # the plan loads it (in place, if vLLM has another version)
        if self.started is None:
            self.started = now
        return news

    @property
    def settled(self) -> bool:
        """Loaded, or failed for good: what readiness waits for."""
        return self.stage is Stage.LOADED or (self.stage is Stage.FAILED and self.permanent)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Load:
    uid: str
    served_name: str
    path: str
    inplace: bool  # vLLM has the name with other files: replace it without a gap in serving


@dataclasses.dataclass(kw_only=True)
class Plan:
    conflicts: dict[str, str] = dataclasses.field(default_factory=dict)  # loser uid -> winner's name
    prepare: list[str] = dataclasses.field(default_factory=list)  # uids to (re)download and validate
    load: list[Load] = dataclasses.field(default_factory=list)
    adopt: list[str] = dataclasses.field(default_factory=list)  # uids vLLM already serves with the right files
    unload: list[str] = dataclasses.field(default_factory=list)  # served names
    foreign: list[str] = dataclasses.field(default_factory=list)  # served names vLLM has that no record explains
    forget: list[str] = dataclasses.field(default_factory=list)  # uids no longer desired


def winners(desired: Sequence[Desired]) -> tuple[list[Desired], dict[str, str]]:
    """One adapter per served name: the oldest (then by name, uid); the others map to the winner's name."""
    by_name: dict[str, list[Desired]] = {}
    for item in desired:
        by_name.setdefault(item.served_name, []).append(item)
    chosen, losers = [], {}
    for group in by_name.values():
        group.sort(key=lambda d: (d.created, d.name, d.uid))
        chosen.append(group[0])
        losers.update({d.uid: group[0].name for d in group[1:]})
    return chosen, losers


def plan(
    *,
    desired: Sequence[Desired],
    records: Mapping[str, Record],
    loaded: Mapping[str, LoadedAdapter] | None,  # None: vLLM is down, do not touch it
    busy: Collection[str],  # uids being prepared right now
    now: float,
    roomy: Collection[str] = (),  # uids refused for room that fit now: retried without waiting out the backoff
) -> Plan:
    result = Plan()
    chosen, result.conflicts = winners(desired)
    for item in chosen:
        record = records.get(item.uid)
        if item.uid in busy:
            continue
        if (
            record is None
            or record.spec_hash != item.spec_hash
            or record.served_name != item.served_name
            or record.conflict_with is not None
        ):
            result.prepare.append(item.uid)
        elif record.stage is Stage.FAILED:
            due = now >= record.retry_at or (item.uid in roomy and record.reason is FailureReason.CACHE_FULL)
            if (record.retrying or not record.permanent) and due:
                result.prepare.append(item.uid)
        elif record.stage in (Stage.PENDING, Stage.PREPARING):
            if now >= record.retry_at:  # deferred (its endpoint busy) until then
                result.prepare.append(item.uid)  # its worker is gone (or never started)
        elif record.stage is Stage.LOADED and record.checking:
            if now >= record.retry_at:  # the check of its new spec, again (it was deferred or failed for now)
                result.prepare.append(item.uid)
        elif record.path is not None and loaded is not None:
            current = loaded.get(item.served_name)
            if current is None:
                result.load.append(Load(uid=item.uid, served_name=item.served_name, path=record.path, inplace=False))
            elif current.path != record.path:
                result.load.append(Load(uid=item.uid, served_name=item.served_name, path=record.path, inplace=True))
            elif record.stage is Stage.READY:
                result.adopt.append(item.uid)
    if loaded is not None:
        # Keep serving an adapter while its new version is prepared; stop once it failed for good (status and
        # serving must agree). Only the agent may load adapters (the operator refuses --lora-modules, the admin
        # guard the API): one that no desired adapter or record explains is foreign.
        wanted = {
            d.served_name
            for d in chosen
            if not (
                (r := records.get(d.uid)) and r.spec_hash == d.spec_hash and r.stage is Stage.FAILED and r.permanent
            )
        }
        known = {record.served_name for record in records.values()}
        known |= {name for name in loaded if name.startswith(CANARY_PREFIX)}  # a check whose unload failed
        result.unload = sorted(name for name in loaded if name not in wanted and name in known)
        result.foreign = sorted(name for name in loaded if name not in wanted and name not in known)
    desired_uids = {d.uid for d in desired}
    result.forget = [uid for uid in records if uid not in desired_uids]
    return result


def ready(*, desired: Sequence[Desired], records: Mapping[str, Record], vllm_up: bool) -> bool:
    """Take traffic only with vLLM up and every desired adapter loaded or failed for good."""
    return vllm_up and not unsettled(desired=desired, records=records)


def unsettled(*, desired: Sequence[Desired], records: Mapping[str, Record]) -> list[str]:
    """Names of the desired adapters neither loaded nor failed for good."""
    return sorted(d.name for d in desired if not ((r := records.get(d.uid)) is not None and r.settled))
