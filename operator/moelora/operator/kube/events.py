"""LoRAAdapter Events: the roll-up's transitions (decide/rollup.py judges which become an Event) recorded through
a small correlator that folds identical Events into one, the way client-go's EventCorrelator does.

The operator emits them, once per adapter and transition of the rolled-up phase, not the agents once per replica:
`kubectl describe lora` then reads like the phase (one `Loaded` for the whole server, one Warning per failure
reason), and a server of many replicas does not multiply each failure by its replica count.

Identical means the same source, involved object (uid included), type, reason and message, as client-go's event
key. An identical Event seen within `WINDOW` of the previous one is not created again: the stored one gets its
`count` raised and its `lastTimestamp` moved (a PATCH), so a failure that comes back keeps one line in
`kubectl get events` with its count. The cache lives in memory, bounded; after a restart or once the stored Event
is gone (404), a new one is created, as client-go does. Core v1 Events, like the ones kopf posts for ModelServers.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import threading
from collections.abc import Mapping
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from moelora.api import GROUP, VERSION
from moelora.operator.decide.rollup import Emission
from moelora.operator.kube import apply

COMPONENT = "moelora-operator"  # the "From" of `kubectl describe`, kopf's Events included (control/wiring.py)
WINDOW = datetime.timedelta(minutes=10)  # client-go's aggregation interval
CACHE_SIZE = 4096  # Events remembered for correlation, least recently seen dropped first
MAX_MESSAGE = 1024  # the API server refuses longer Event messages


def adapter_reference(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The involvedObject of a LoRAAdapter's Events."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LoRAAdapter",
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta.get("uid", ""),
    }


@dataclasses.dataclass
class _Seen:
    name: str  # the stored Event's name
    count: int
    last: datetime.datetime


def _key(involved: Mapping[str, Any], emission: Emission) -> tuple[str, ...]:
    fields = ("apiVersion", "kind", "namespace", "name", "uid")
    return (COMPONENT, *(str(involved.get(f, "")) for f in fields), emission.type, emission.reason, emission.message)


def _stamp(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_event(involved: Mapping[str, Any], emission: Emission, *, now: datetime.datetime) -> dict[str, Any]:
    """A fresh core v1 Event (count 1); the API server names it from generateName."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": involved["namespace"], "generateName": f"{involved['name']}."},
        "involvedObject": dict(involved),
        "type": emission.type,
        "reason": emission.reason,
        "message": emission.message[:MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "action": emission.reason,
        "count": 1,
        "firstTimestamp": _stamp(now),
        "lastTimestamp": _stamp(now),
    }


class Recorder:
    """Records Events, folding identical ones seen within WINDOW into the stored one. Thread-safe: roll-ups run in
    the executor, and one lock keeps two of them from both creating the same Event."""

    def __init__(self, *, window: datetime.timedelta = WINDOW, size: int = CACHE_SIZE) -> None:
        self._window, self._size = window, size
        self._seen: collections.OrderedDict[tuple[str, ...], _Seen] = collections.OrderedDict()
        self._lock = threading.Lock()

    def record(
        self,
        *,
        api: kubernetes.client.ApiClient,
        involved: Mapping[str, Any],
        emission: Emission,
        now: datetime.datetime,
    ) -> dict[str, Any]:
        """Create the Event, or raise the count of the identical one seen within the window. Returns it as stored."""
        key = _key(involved, emission)
        namespace = str(involved["namespace"])
        with self._lock:
            seen = self._seen.pop(key, None)
            stored = None
            if seen is not None and now - seen.last <= self._window:
                patch = {"count": seen.count + 1, "lastTimestamp": _stamp(now)}
                try:
                    stored = apply.patch_event(api=api, namespace=namespace, name=seen.name, patch=patch)
                except ApiException as exc:
                    if exc.status != 404:  # expired by the API server's TTL: a new one, as client-go does
                        raise
            if stored is None:
                stored = apply.create_event(api=api, namespace=namespace, event=new_event(involved, emission, now=now))
            self._seen[key] = _Seen(name=stored["metadata"]["name"], count=int(stored.get("count") or 1), last=now)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)
            return stored
