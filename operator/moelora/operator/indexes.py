"""kopf's in-memory indexes, all keyed by (namespace, ModelServer name): which servers exist, their adapters with
their phases, their pods with their readiness. Handlers read them in the event loop (indexes are not thread-safe),
as snapshots taken before any blocking work.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import kopf

from moelora.operator import naming
from moelora.operator.context import Context, ServerKey
from moelora.operator.status import pod_ready


class AdapterEntry(NamedTuple):
    name: str
    phase: str
    secret: str | None = None  # spec.source.credentialsSecret.name
    served: str = ""  # the `model` name clients send: spec.servedName, else the name


class PodEntry(NamedTuple):
    name: str
    ready: bool


ServersIndex = kopf.Index[ServerKey, ServerKey]
AdaptersIndex = kopf.Index[ServerKey, AdapterEntry]
PodsIndex = kopf.Index[ServerKey, PodEntry]


def model_servers_index(name: str, namespace: str, **_: Any) -> dict[ServerKey, ServerKey]:
    # Only which servers exist: a reconcile reads the server itself when it runs.
    return {(namespace, name): (namespace, name)}


def adapters_index(
    spec: kopf.Spec, status: kopf.Status, name: str, namespace: str, **_: Any
) -> dict[ServerKey, AdapterEntry] | None:
    server = spec.get("modelServer")
    if not server:
        return None
    secret = ((spec.get("source") or {}).get("credentialsSecret") or {}).get("name")
    phase = status.get("phase") or "Pending"
    served = spec.get("servedName") or name
    return {(namespace, server): AdapterEntry(name=name, phase=phase, secret=secret, served=served)}


def pods_index(
    status: kopf.Status, labels: kopf.Labels, name: str, namespace: str, **_: Any
) -> dict[ServerKey, PodEntry] | None:
    server = labels.get(naming.LABEL_SERVER)
    if not server:
        return None
    return {(namespace, server): PodEntry(name=name, ready=pod_ready(status))}


def servers(index: ServersIndex, key: ServerKey) -> list[ServerKey]:
    return list(index.get(key, []))


def pods(index: PodsIndex, key: ServerKey) -> dict[str, bool]:
    """A server's pods -> ready."""
    return {entry.name: entry.ready for entry in index.get(key, [])}


def adapters(index: AdaptersIndex, key: ServerKey) -> list[AdapterEntry]:
    return list(index.get(key, []))


def adapter_secrets(entries: list[AdapterEntry]) -> frozenset[str]:
    """The credentials Secrets a server's adapters name."""
    return frozenset(entry.secret for entry in entries if entry.secret)


def served_adapters(entries: list[AdapterEntry]) -> frozenset[str]:
    """The `model` names a server's adapters are routed by: all but the Failed, which no pod serves."""
    return frozenset(entry.served or entry.name for entry in entries if entry.phase != "Failed")


def adapter_phases(memo: Context, index: AdaptersIndex, key: ServerKey) -> list[AdapterEntry]:
    """A server's adapters with their latest phases: the index's, except where this operator has written a newer
    phase whose watch event has not come back yet (the index learns a write only then). Without this, two adapters
    failing at once could each be counted from an index that lacks the other, and the last status write would
    keep the stale count until the next resync: nothing else prompts a recount once the events have come back."""
    written = memo.written_phases[key]
    entries = adapters(index, key)
    for gone in set(written) - {entry.name for entry in entries}:
        del written[gone]
    return [entry._replace(phase=written[entry.name]) if entry.name in written else entry for entry in entries]
