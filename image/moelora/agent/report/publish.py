"""The agent's status writes: each adapter's key of `status.replicas`, written only when what it says changed, and
for adapters this pod serves on demand, its key of `status.onDemandLoad` (the load placement's copiesMode Auto must
count too; the operator keeps no `replicas` entry of a pod that is not assigned the adapter)."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from moelora.agent.check.validate import AdapterInfo
from moelora.agent.reconcile import Desired, Record, Stage
from moelora.api import ReplicaAdapterState

logger = logging.getLogger(__name__)


class ReplicaWriter(Protocol):
    def patch_replica(self, *, name: str, pod: str, state: ReplicaAdapterState, info: AdapterInfo | None) -> bool: ...

    def patch_on_demand_load(self, *, name: str, pod: str, load: float | None) -> bool: ...


class StatusPublisher:
    def __init__(self, *, kube: ReplicaWriter, pod: str, pool: concurrent.futures.Executor) -> None:
        self.kube = kube
        self.pod = pod
        self.pool = pool
        self.written: dict[str, tuple[Any, ...]] = {}  # uid -> what its status says now
        self.on_demand: dict[str, tuple[str, float]] = {}  # uid -> (adapter name, the load its onDemandLoad says)

    def forget(self, uid: str) -> None:
        self.written.pop(uid, None)

    def publish(self, desired: list[Desired], records: Mapping[str, Record]) -> None:
        """Patch the status of every adapter whose state changed since the last write, a few at a time (hundreds
        of adapters settling at once would otherwise queue behind one another's round trips)."""
        pending = []
        for item in desired:
            record = records.get(item.uid)
            if record is None:
                continue
            state = record.state()
            # The files' facts of what is served, or of what was refused for good (the rank a RankTooHigh read).
            info = (
                record.info
                if record.stage is Stage.LOADED or (record.stage is Stage.FAILED and record.permanent)
                else None
            )
            key = (state.model_dump_json(exclude={"loaded_at"}), info)
            if self.written.get(item.uid) != key:
                pending.append((item, state, info, key))
        on_demand = self._on_demand_writes(desired, records)
        if not pending and not on_demand:
            return

        def write(item: Desired, state: ReplicaAdapterState, info: AdapterInfo | None) -> None:
            self.kube.patch_replica(name=item.name, pod=self.pod, state=state, info=info)

        futures = {self.pool.submit(write, item, state, info): (item, key) for item, state, info, key in pending}
        for future, (item, key) in futures.items():
            try:
                future.result()
            except Exception as error:  # noqa: BLE001 - the API may be briefly away: retried next pass
                logger.warning("could not write status of %s: %s", item.name, type(error).__name__)
                continue
            self.written[item.uid] = key
        self._write_on_demand(on_demand)

    def _on_demand_writes(self, desired: list[Desired], records: Mapping[str, Record]) -> dict[str, tuple[str, float]]:
        """uid -> (name, load; 0 deletes the key) for every onDemandLoad key to change: the records beside the placed
        `desired` are those held on demand (the loop keeps no others), with their sampled load; a key written
        before goes once its adapter is placed here, dropped or forgotten, or idle."""
        placed = {item.uid for item in desired}
        now = {
            uid: (record.name, record.load or 0.0)
            for uid, record in records.items()
            if uid not in placed and record.stage is Stage.LOADED
        }
        changes = {uid: entry for uid, entry in now.items() if entry[1] != self.on_demand.get(uid, ("", 0.0))[1]}
        changes.update({uid: (name, 0.0) for uid, (name, _) in self.on_demand.items() if uid not in now})
        return changes

    def _write_on_demand(self, changes: Mapping[str, tuple[str, float]]) -> None:
        futures = {
            self.pool.submit(self.kube.patch_on_demand_load, name=name, pod=self.pod, load=load or None): uid
            for uid, (name, load) in changes.items()
        }
        for future, uid in futures.items():
            name, load = changes[uid]
            try:
                found = future.result()
            except Exception as error:  # noqa: BLE001 - the API may be briefly away: retried next pass
                logger.warning("could not write the on-demand load of %s: %s", name, type(error).__name__)
                continue
            if load and found:
                self.on_demand[uid] = (name, load)
            else:
                self.on_demand.pop(uid, None)
