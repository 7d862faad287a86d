"""The agent's status writes: each adapter's key of `status.replicas`, written only when what it says changed."""

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


class StatusPublisher:
    def __init__(self, *, kube: ReplicaWriter, pod: str, pool: concurrent.futures.Executor) -> None:
        self.kube = kube
        self.pod = pod
        self.pool = pool
        self.written: dict[str, tuple[Any, ...]] = {}  # uid -> what its status says now

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
        if not pending:
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
