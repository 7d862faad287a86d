"""The operator's own writes, as its passes need to remember them ("expectations", after controller-runtime's).

kopf's indexes learn a write of ours only when its watch event comes back, seconds later under load; judged from the
older copy meanwhile, a pass would write again what it just wrote, or count a phase it already changed. This store
keeps, per adapter, the status we last wrote (by resourceVersion) and the inputs we last judged it from with nothing to
write; per server, what its last reconcile rendered from, the counts we last wrote, the placements we last wrote, the
loaded entries we cleared and the adapters' routes we last wrote. It is the only per-object state the operator keeps
besides the queue. Roll-ups write it from the executor's threads, so the adapter half is behind a lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Mapping
from typing import Any

from moelora.api import AdapterPlacement

ServerKey = tuple[str, str]  # (namespace, ModelServer name): the key of the queue, the indexes and this store
AdapterKey = tuple[str, str]  # (namespace, LoRAAdapter name)


def resource_version(body: Mapping[str, Any]) -> int:
    """The object's resourceVersion as the integer every API server issues (an etcd revision); 0 when it is not one."""
    value = str((body.get("metadata") or {}).get("resourceVersion") or "0")
    return int(value) if value.isdigit() else 0


@dataclasses.dataclass
class ServerWrites:
    """What this operator last did to one server and its adapters' placements."""

    rendered: Any = None  # controller.Rendered of its last reconcile; None: reconcile at the next pass
    # adapter -> the header value its body-based router ConfigMap last got (None: deleted); absent: unknown
    routes: dict[str, str | None] = dataclasses.field(default_factory=dict)
    counted: dict[str, int] | None = None  # its status.adapters as last written
    placements: dict[str, AdapterPlacement | None] = dataclasses.field(default_factory=dict)  # None: removed
    cleared: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)  # (adapter, pod) -> loadedAt


class Expectations:
    """See the module's docstring. One per operator (Context.expectations)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._statuses: dict[AdapterKey, tuple[int, dict[str, Any]]] = {}
        self._judged: dict[AdapterKey, Hashable] = {}
        self._servers: dict[ServerKey, ServerWrites] = {}

    # Adapters: status writes and judgements.

    def status_written(self, key: AdapterKey, stored: Mapping[str, Any]) -> None:
        """Record a status write as the API server stored it; of two writes finishing out of order, the later
        stored (higher resourceVersion) is kept."""
        version = resource_version(stored)
        if not version:
            return
        with self._lock:
            if version > self._statuses.get(key, (0, {}))[0]:
                self._statuses[key] = (version, dict(stored.get("status") or {}))

    def written_version(self, key: AdapterKey) -> int:
        return self._statuses.get(key, (0, {}))[0]

    def freshest(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The adapter with the status we last wrote, where that write is newer than `body` (an index copy from
        before its watch event came back). Forgets the write once a copy at least as new arrives."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        written = self._statuses.get(key)
        if written is None:
            return body
        if written[0] > resource_version(body):
            return {**body, "status": written[1]}
        with self._lock:  # unless a later write has replaced it meanwhile
            if self._statuses.get(key) == written:
                del self._statuses[key]
        return body

    def phase(self, key: AdapterKey, body: Mapping[str, Any] | None, phase: str) -> str:
        """The adapter's phase: the index's, unless our last write is newer than the index's copy."""
        written = self._statuses.get(key)
        if written is not None and body is not None and written[0] > resource_version(body):
            return str(written[1].get("phase") or phase)
        return phase

    def judged(self, key: AdapterKey) -> Hashable:
        return self._judged.get(key)

    def judged_with_nothing_to_write(self, key: AdapterKey, inputs: Hashable) -> None:
        with self._lock:
            self._judged[key] = inputs

    def forget_adapter(self, key: AdapterKey) -> None:
        with self._lock:
            self._statuses.pop(key, None)
            self._judged.pop(key, None)

    # Servers.

    def server(self, key: ServerKey) -> ServerWrites:
        """The server's record (an empty one when there is none: it is stored once something is written)."""
        return self._servers.get(key) or ServerWrites()

    def update_server(self, key: ServerKey, **fields: Any) -> None:
        with self._lock:
            updated = dataclasses.replace(self._servers.get(key) or ServerWrites(), **fields)
            if updated == ServerWrites():
                self._servers.pop(key, None)
            else:
                self._servers[key] = updated

    def forget_rendered(self, key: ServerKey) -> None:
        """Its next pass reconciles the server whatever moved (the resync; the server gone). Placements written
        stay: they are cleared only as the adapters' own copies show them."""
        self.update_server(key, rendered=None, routes={}, counted=None)
