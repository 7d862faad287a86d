"""kopf's in-memory indexes, all keyed by (namespace, ModelServer name): which servers exist (and which spec of
theirs), their adapters with their phases, their pods with their readiness, the children it watches with their
versions. A pass (control/controller.py) reads them in the event loop (indexes are not thread-safe), as snapshots
taken before any blocking work.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import kopf
import pydantic

from moelora.api import AdapterPlacement, CopiesMode, LoRASpec, PlacementSpec
from moelora.operator.decide.assignment import AdapterState, Server, pods_needed
from moelora.operator.decide.expectations import Expectations, ServerKey
from moelora.operator.decide.status import pod_ready
from moelora.operator.render import naming
from moelora.operator.render.deployment import quantity_bytes


class AdapterEntry(NamedTuple):
    name: str
    phase: str
    secret: str | None = None  # spec.source.credentialsSecret.name
    served: str = ""  # the `model` name clients send: spec.servedName, else the name
    # What a roll-up judges (metadata, spec, status), so a pod event re-judges a server's adapters from the index
    # instead of reading each one back: a pod event then costs no API call per adapter.
    body: Mapping[str, Any] | None = None
    placed: AdapterState | None = None  # placement's inputs (see assignment.py)


class PodEntry(NamedTuple):
    name: str
    ready: bool


class GatewayRouting(NamedTuple):
    """How a server routed through an inference gateway names its adapters to the body-based router."""

    base: str  # the base model's served name: the header value of the server's pool
    home: bool = False  # routing.gateway.routeToHome


class ServerEntry(NamedTuple):
    """A ModelServer as its children depend on it: which object (a server deleted and created again is another) and
    which spec (generation moves with the spec only, not with status writes)."""

    key: ServerKey
    uid: str = ""
    generation: int = 0
    routing: GatewayRouting | None = None  # None: no gateway routing


def gateway_routing(spec: Mapping[str, Any], name: str) -> GatewayRouting | None:
    gateway = (spec.get("routing") or {}).get("gateway") or {}
    if not gateway.get("enabled"):
        return None
    base = (spec.get("model") or {}).get("servedName") or name
    return GatewayRouting(base=str(base), home=bool(gateway.get("routeToHome")) and spec.get("placement") is not None)


class ChildEntry(NamedTuple):
    """A child the operator watches (Deployment, StatefulSet, model cache claim and Job), with a digest of what it
    holds: a pass reconciles its server when the digest moves. Not its resourceVersion, which the local emulator
    leaves unchanged on writes of built-in kinds (a real API server bumps it on every write)."""

    kind: str
    name: str
    digest: str


ServersIndex = kopf.Index[ServerKey, ServerEntry]
ChildrenIndex = kopf.Index[ServerKey, ChildEntry]
PlacementIndex = kopf.Index[ServerKey, Server]
AdaptersIndex = kopf.Index[ServerKey, AdapterEntry]
PodsIndex = kopf.Index[ServerKey, PodEntry]


def model_servers_index(body: kopf.Body, name: str, namespace: str, **_: Any) -> dict[ServerKey, ServerEntry]:
    # Which servers exist and at which spec: a reconcile reads the server itself when it runs.
    meta = body.get("metadata") or {}
    uid, generation = str(meta.get("uid") or ""), int(meta.get("generation") or 0)
    routing = gateway_routing(body.get("spec") or {}, name)
    return {(namespace, name): ServerEntry(key=(namespace, name), uid=uid, generation=generation, routing=routing)}


def children_index(
    body: kopf.Body, labels: kopf.Labels, name: str, namespace: str, **_: Any
) -> dict[ServerKey, ChildEntry] | None:
    server = labels.get(naming.LABEL_SERVER)
    if not server:
        return None
    return {(namespace, server): ChildEntry(kind=str(body.get("kind") or ""), name=name, digest=digest(body))}


def digest(body: Mapping[str, Any]) -> str:
    """A short hash of an object's metadata (but its resourceVersion and managedFields), spec and status."""
    meta = {key: value for key, value in (body.get("metadata") or {}).items() if key not in _VOLATILE}
    content = {"metadata": meta, "spec": body.get("spec"), "status": body.get("status")}
    encoded = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(encoded, digest_size=8).hexdigest()


_VOLATILE = ("resourceVersion", "managedFields")


def adapters_index(
    body: kopf.Body, spec: kopf.Spec, status: kopf.Status, name: str, namespace: str, **_: Any
) -> dict[ServerKey, AdapterEntry] | None:
    server = spec.get("modelServer")
    if not server:
        return None
    meta = body.get("metadata") or {}
    kept = {
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "generation", "resourceVersion", "deletionTimestamp")
            if key in meta
        },
        "spec": copy.deepcopy(dict(spec)),
        "status": copy.deepcopy(dict(status)),
    }
    secret = ((spec.get("source") or {}).get("credentialsSecret") or {}).get("name")
    placed = AdapterState(
        name=name,
        copies=spec.get("replicas"),
        size_bytes=int(status.get("sizeBytes") or 0),
        current=AdapterPlacement.model_validate(status["placement"]) if status.get("placement") else None,
        loaded_on={
            pod: _epoch(state.get("loadedAt"))
            for pod, state in (status.get("replicas") or {}).items()
            if (state or {}).get("loaded")
        },
        load=adapter_load(status),
        pod_load=pod_load(status),
    )
    phase = status.get("phase") or "Pending"
    served = spec.get("servedName") or name
    entry = AdapterEntry(name=name, phase=phase, secret=secret, served=served, body=kept, placed=placed)
    return {(namespace, server): entry}


def adapter_load(status: Mapping[str, Any]) -> float:
    """Requests for the adapter in flight, summed over every pod that serves it (`pod_load`)."""
    return sum(pod_load(status).values())


def pod_load(status: Mapping[str, Any]) -> dict[str, float]:
    """Pod -> requests for the adapter in flight there: its assigned pods' entries (`replicas.<pod>.load`) and the
    pods that serve it on demand (`onDemandLoad`); a pod with both, for a moment while it is assigned one it held,
    counts once, by its entry."""
    entries = status.get("replicas") or {}
    loads = {pod: float(value or 0) for pod, value in (status.get("onDemandLoad") or {}).items()}
    loads.update({pod: float((state or {}).get("load") or 0) for pod, state in entries.items()})
    return loads


def _epoch(timestamp: Any) -> float:
    """An agent's RFC 3339 loadedAt as epoch seconds; 0 (long ago) when missing or unreadable."""
    try:
        return datetime.datetime.fromisoformat(str(timestamp)).timestamp()
    except ValueError:
        return 0.0


def placement_index(spec: kopf.Spec, name: str, namespace: str, **_: Any) -> dict[ServerKey, Server] | None:
    """Servers with spec.placement -> placement's inputs from their spec (the others are not indexed)."""
    placement = spec.get("placement")
    if placement is None:
        return None
    cache = (spec.get("adapterCache") or {}).get("sizeLimit") or "20Gi"
    try:
        disk_bytes: int | None = quantity_bytes(str(cache))
    except ValueError:
        disk_bytes = None  # the reconcile reports the invalid spec; place without a budget meanwhile
    try:
        lora = LoRASpec.model_validate(spec.get("lora") or {})
    except pydantic.ValidationError:  # the reconcile reports the invalid spec; vLLM's defaults meanwhile
        lora = LoRASpec()
    slots = lora.max_cpu_loras or lora.max_loras  # vLLM's default CPU slots are maxLoras
    routing = gateway_routing(spec, name)
    per_slot = int(placement.get("adaptersPerCpuLora") or PlacementSpec.model_fields["adapters_per_cpu_lora"].default)
    server = Server(
        name=name,
        replicas=int(spec.get("replicas", 1)),
        copies=int(placement.get("copies") or 1),
        disk_bytes=disk_bytes,
        drain_seconds=float(placement.get("drainSeconds", 30)),
        max_adapters=slots * per_slot,
        auto=placement.get("copiesMode") == CopiesMode.AUTO.value,
        slots=slots,
        on_demand_slots=lora.max_loras,
        one_or_all=bool(routing and routing.home),
    )
    return {(namespace, name): server}


def pods_index(
    status: kopf.Status, labels: kopf.Labels, name: str, namespace: str, **_: Any
) -> dict[ServerKey, PodEntry] | None:
    server = labels.get(naming.LABEL_SERVER)
    if not server:
        return None
    return {(namespace, server): PodEntry(name=name, ready=pod_ready(status))}


def placed_server(index: PlacementIndex, key: ServerKey) -> Server | None:
    found = list(index.get(key, []))
    return found[0] if found else None


def servers(index: ServersIndex, key: ServerKey) -> list[ServerKey]:
    return [entry.key for entry in index.get(key, [])]


def server_entry(index: ServersIndex, key: ServerKey) -> ServerEntry | None:
    found = list(index.get(key, []))
    return found[0] if found else None


def children(indexes: Collection[ChildrenIndex], key: ServerKey) -> frozenset[ChildEntry]:
    """The server's watched children with their digests, over the indexes of each kind."""
    return frozenset(entry for index in indexes for entry in index.get(key, []))


def pods(index: PodsIndex, key: ServerKey) -> dict[str, bool]:
    """A server's pods -> ready."""
    return {entry.name: entry.ready for entry in index.get(key, [])}


def adapters(index: AdaptersIndex, key: ServerKey) -> list[AdapterEntry]:
    return list(index.get(key, []))


def adapter_secrets(entries: list[AdapterEntry]) -> frozenset[str]:
    """The credentials Secrets a server's adapters name."""
    return frozenset(entry.secret for entry in entries if entry.secret)


def adapter_phases(known: Expectations, namespace: str, entries: list[AdapterEntry]) -> list[AdapterEntry]:
    """A server's adapters with their latest phases: the index's, except where this operator's last status write
    (expectations.py) is newer than the index's copy, whose watch event has not come back yet. Without
    this, two adapters failing at once could each be counted from an index that lacks the other, and the last
    status write would keep the stale count until the next resync. Judged by resourceVersion, so a write that
    finished late but was made earlier (two roll-ups of one adapter in flight) never hides the later one."""
    return [entry._replace(phase=known.phase((namespace, entry.name), entry.body, entry.phase)) for entry in entries]


def placement_short(written: Mapping[str, AdapterPlacement | None], entries: list[AdapterEntry]) -> tuple[int, int]:
    """(adapters, copies) of a placed server that no pod had room for, with this operator's latest writes."""
    shorts = []
    for entry in entries:
        current = written[entry.name] if entry.name in written else (entry.placed.current if entry.placed else None)
        if current is not None and current.short:
            shorts.append(current.short)
    return len(shorts), sum(shorts)


def assigned_pods(written: Mapping[str, AdapterPlacement | None], server: str, entries: list[AdapterEntry]) -> int:
    """Pods of a placed server its adapters' assignments still name (with this operator's latest writes)."""
    assigned = []
    for entry in entries:
        if entry.name in written:
            current = written[entry.name]
            assigned.append(tuple(current.replicas) if current is not None else ())
        elif entry.placed is not None:
            assigned.append(entry.placed.assigned)
    return pods_needed(assigned, server=server)
