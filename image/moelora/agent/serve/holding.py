"""The loop's side of adapters held on demand (ondemand.py has the resolver's side): which adapters this pod holds
though they are not placed here, which of them go to make room, and the answers the records give the resolver.

The runner calls `desired` at the start of each pass (the placed adapters plus the held ones, which the plan then
treats alike) and `answer` at its end; the records stay the runner's, read here and never changed.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable, Collection, Mapping

from moelora.agent.prepare import Preparer
from moelora.agent.reconcile import Desired, LoadedAdapter, Record, Stage
from moelora.agent.report.metrics import Metrics
from moelora.agent.serve import foreign, ondemand
from moelora.agent.store.cache import AdapterCache
from moelora.api import FailureReason

logger = logging.getLogger(__name__)

# vLLM registers files its resolver got before answering the request: until then the loop does not load them itself.
HAND_OVER_SECONDS = 60.0


class Holding:
    def __init__(
        self,
        *,
        model_server: str,
        cache_dir: pathlib.Path,
        catalogue: Callable[[], list[Desired]],
        resolutions: ondemand.Resolutions,
        metrics: Metrics,
        preparer: Preparer,
        cache: AdapterCache,
    ) -> None:
        self.model_server, self.cache_dir, self.catalogue = model_server, cache_dir, catalogue
        self.resolutions, self.metrics, self.preparer, self.cache = resolutions, metrics, preparer, cache
        self.held: dict[str, tuple[str, float]] = {}  # uid -> (name, when a request last asked for it)
        self.room_coming: set[str] = set()  # uids refused for room that dropping held adapters makes room for

    def desired(
        self,
        placed: list[Desired],
        *,
        now: float,
        loaded: Mapping[str, LoadedAdapter] | None,
        records: Mapping[str, Record],
        busy: Collection[str],
    ) -> list[Desired]:
        """`placed` and the adapters held on demand: those a request asked for since (refused for names that are
        no LoRAAdapter of this server), less those placed here now, gone, or dropped for room. Files from this
        agent's cache that vLLM serves under a name no record explains were handed over by an agent before a
        restart: held again, not unloaded as foreign."""
        asked = self.resolutions.asked()
        explained = {d.served_name for d in placed} | {r.served_name for r in records.values()}
        handed = [
            name for name, adapter in (loaded or {}).items() if name not in explained and self.from_cache(adapter.path)
        ]
        if not asked and not self.held and not handed:
            self.room_coming = set()
            return placed
        here = {d.uid for d in placed}
        catalogue = self.catalogue()
        for name in handed:
            item = ondemand.find(catalogue, name)
            if item is not None and item.uid not in here:
                self.held.setdefault(item.uid, (item.name, now))
                self.metrics.on_demand.labels(item.name).set(1)
        for name in asked:
            item = ondemand.find(catalogue, name)
            if item is None:
                logger.info("refused to resolve %s: no LoRAAdapter of this server serves it", foreign.escape(name))
                self.resolutions.refuse(name, ondemand.not_found(name, model_server=self.model_server))
            elif item.uid not in here:
                if item.uid not in self.held:
                    logger.info("adapter %s asked for on this pod, where it is not placed: loading it", item.name)
                self.held[item.uid] = (item.name, now)
                self.metrics.on_demand.labels(item.name).set(1)
        by_uid = {d.uid: d for d in catalogue}
        for uid in [uid for uid in self.held if uid in here or uid not in by_uid]:
            self._drop(uid)
        for uid in self._room(asked, records, busy):
            logger.info("dropping adapter %s, held on demand, to make room", self.held[uid][0])
            self._drop(uid)
        return placed + [by_uid[uid] for uid in self.held]

    def from_cache(self, path: str) -> bool:
        """Files in this agent's cache: vLLM got them from this agent (its loads, or its resolver's answers). Normalized
        first, so that a path climbing out of the cache with `..` is not taken for one inside it."""
        return pathlib.Path(os.path.normpath(path)).is_relative_to(os.path.normpath(self.cache_dir))

    def _drop(self, uid: str) -> None:
        name, _ = self.held.pop(uid)
        self.metrics.forget_on_demand(name)

    def _room(self, asked: list[str], records: Mapping[str, Record], busy: Collection[str]) -> list[str]:
        """The held adapters to drop (coldest first) so that those refused for room fit; notes in `room_coming` the
        refused ones that will fit then (their requests wait for the retry)."""
        self.room_coming = set()
        short = [
            uid
            for uid, r in records.items()
            if r.stage is Stage.FAILED and r.reason is FailureReason.CACHE_FULL and r.retrying and uid not in busy
        ]
        if not short:
            return []
        need = self.preparer.room_needed(short)
        if need <= 0:  # room grew meanwhile: the retry comes at the next poll
            self.room_coming = set(short)
            return []
        sizes = {entry.version: entry.size for entry in self.cache.entries()}
        held = [
            ondemand.Held(uid=uid, load=record.load or 0.0, since=since, size=sizes.get(record.version or "", 0))
            for uid, (_, since) in self.held.items()
            if (record := records.get(uid)) is not None
            and uid not in short
            and uid not in busy
            and record.served_name not in asked
        ]
        victims = ondemand.coldest(held, need)
        if victims:
            self.room_coming = set(short)
        return victims

    def answer(self, desired: list[Desired], records: Mapping[str, Record]) -> None:
        """Answer the resolver's requests that the records can answer now, and say what may be answered at once."""
        uids = {d.uid for d in desired}
        mine = [r for r in records.values() if r.uid in uids and r.conflict_with is None]
        by_name = {r.served_name: r for r in mine}
        for name in self.resolutions.asked():
            record = by_name.get(name)
            if record is None or record.uid in self.room_coming:
                continue
            answer = ondemand.answer_for(record, name=name)
            if answer is None:
                continue
            if answer.status != 200:
                logger.info("refused to resolve %s: %s", record.name, answer.message)
                self.resolutions.refuse(name, answer)
            else:
                self.resolutions.serve(name, answer.path or "")
        self.resolutions.servable(
            {
                r.served_name: r.path
                for r in mine
                if r.path is not None and (r.stage is Stage.LOADED or (r.stage is Stage.READY and r.handed_at))
            }
        )
