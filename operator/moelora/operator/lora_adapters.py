"""LoRAAdapter handlers: the operator's share of an adapter's status, rolled up from the per-pod states its server's
agents write, whenever the adapter, a server pod, or the server changes.

A phase change also rewrites the server's adapter counts at once, so they follow without waiting for a resync.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import kopf
import kubernetes.client
import pydantic

from moelora.api import AdapterSource, S3Spec
from moelora.operator import apply, events, indexes, metrics, model_servers, naming, policy, status
from moelora.operator.context import API_THREADS, Context, ServerKey, wall_clock
from moelora.operator.indexes import AdapterEntry

# Status patches of one server's adapters in flight at once: half the executor's threads, the rest for other handlers.
ROLLUP_CONCURRENCY = API_THREADS // 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """A LoRAAdapter as stored, with what its phase is judged from."""

    body: Mapping[str, Any]
    server_exists: bool
    pods: Mapping[str, bool]  # the server's pods -> ready
    refused: str | None = None  # why policy refuses its source (SourceNotAllowed)


def named_pods(body: Mapping[str, Any]) -> set[str]:
    """The pods whose agents have an entry in the adapter's status."""
    return set((body.get("status") or {}).get("replicas") or {})


def resolve_pods(
    *, api: kubernetes.client.ApiClient, namespace: str, server: str, names: Collection[str]
) -> dict[str, bool]:
    """Pods the index lacks but the API server still has as pods of `server` -> ready (the index's watch may lag
    the pod's agent: such a pod is not gone, so not pruned). One GET per name."""
    found_pods = {}
    for pod in sorted(names):
        found = apply.get_pod(api=api, namespace=namespace, name=pod)
        if found is not None and (found["metadata"].get("labels") or {}).get(naming.LABEL_SERVER) == server:
            found_pods[pod] = status.pod_ready(found.get("status") or {})
    return found_pods


def observe_pods(
    *, api: kubernetes.client.ApiClient, body: Mapping[str, Any], known: Mapping[str, bool]
) -> dict[str, bool]:
    """The server's pods -> ready: the index's, plus the pods the adapter's status names that the index lacks but
    the API server still has."""
    meta, spec = body["metadata"], body.get("spec") or {}
    missing = named_pods(body) - set(known)
    server = spec.get("modelServer") or ""
    return {**known, **resolve_pods(api=api, namespace=meta["namespace"], server=server, names=missing)}


def render_status_patch(observation: Observation, *, now: datetime.datetime) -> dict[str, Any]:
    """The merge patch of the operator's share of the status; empty when nothing changes."""
    meta, spec = observation.body["metadata"], observation.body.get("spec") or {}
    return status.adapter_status_patch(
        dict(observation.body.get("status") or {}),
        served_name=spec.get("servedName") or meta["name"],
        generation=meta.get("generation"),
        server_exists=observation.server_exists,
        pods=observation.pods,
        now=now,
        refused=observation.refused,
        assigned=((observation.body.get("status") or {}).get("placement") or {}).get("replicas"),
    )


def freshest(memo: Context, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The adapter with the status this operator last wrote, where that write is newer than `body` (an event or
    index copy from before the write's watch event came back); judged from the older copy, the roll-up would write
    again what it just wrote. Forgets the write once a copy at least as new arrives. resourceVersions are compared
    as the integers every API server issues (etcd revisions); one that is not an integer is never kept."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    written = memo.written_statuses.get(key)
    if written is None:
        return body
    version, written_status = written
    if version > indexes.resource_version(body):
        return {**body, "status": written_status}
    with memo.written_lock:  # unless a later write has replaced it meanwhile
        if memo.written_statuses.get(key) == written:
            del memo.written_statuses[key]
    return body


def source_refusal(*, memo: Context, body: Mapping[str, Any]) -> str | None:
    """Why policy refuses the adapter's source, judged with its server's endpoint; None when allowed, or when the
    spec or the server cannot be read (other reasons report those). The server is read only for an adapter naming
    an endpoint of its own: the rest need only the bucket rule, so a recount costs no read per adapter."""
    meta, spec = body["metadata"], body.get("spec") or {}
    try:
        source = AdapterSource.model_validate(spec.get("source") or {})
    except pydantic.ValidationError:
        return None
    server_endpoint = None
    if source.endpoint_url is not None:
        server = apply.get_model_server(api=memo.api, namespace=meta["namespace"], name=spec.get("modelServer", ""))
        if server is None:
            return None
        try:
            server_endpoint = S3Spec.model_validate((server.get("spec") or {}).get("s3") or {}).endpoint_url
        except pydantic.ValidationError:
            return None
    return policy.adapter_source_problem(source, server_endpoint=server_endpoint, settings=memo.settings)


@metrics.timed("LoRAAdapter")
def rollup_adapter(
    *, memo: Context, body: Mapping[str, Any], server_exists: bool, pods: Mapping[str, bool]
) -> str | None:
    """Write the operator's share of one adapter's status if it changed. The new phase if the phase changed.
    `pods` must already hold every pod the adapter's status names that still exists (see observe_pods)."""
    body = freshest(memo, body)
    refused = source_refusal(memo=memo, body=body) if server_exists else None
    observation = Observation(body=body, server_exists=server_exists, pods=pods, refused=refused)
    patch = render_status_patch(observation, now=wall_clock())
    if not patch:
        return None
    meta = body["metadata"]
    stored = apply.patch_status(
        api=memo.api, plural="loraadapters", namespace=meta["namespace"], name=meta["name"], status=patch
    )
    if stored is not None and (version := indexes.resource_version(stored)):
        key = (meta["namespace"], meta["name"])
        with memo.written_lock:  # two roll-ups of one adapter may finish out of order: keep the later write
            if version > memo.written_statuses.get(key, (0, {}))[0]:
                memo.written_statuses[key] = (version, stored.get("status") or {})
    emission = events.adapter_transition(body.get("status") or {}, patch)
    if stored is not None and emission is not None:
        memo.events.record(api=memo.api, involved=events.adapter_reference(meta), emission=emission, now=wall_clock())
    return patch.get("phase")


def record_deleted(*, memo: Context, body: Mapping[str, Any]) -> None:
    """The Deleted Event of an adapter gone from the API server."""
    involved = events.adapter_reference(body["metadata"])
    memo.events.record(api=memo.api, involved=involved, emission=events.DELETED, now=wall_clock())


def observe_and_rollup(
    *, memo: Context, body: Mapping[str, Any], server_exists: bool, pods: Mapping[str, bool]
) -> str | None:
    """rollup_adapter with the pods its status names that the index lacks read from the API."""
    body = freshest(memo, body)
    observed = observe_pods(api=memo.api, body=body, known=pods)
    return rollup_adapter(memo=memo, body=body, server_exists=server_exists, pods=observed)


async def rollup_server_adapters(
    *, memo: Context, key: ServerKey, adapters: list[AdapterEntry], server_exists: bool, pods: Mapping[str, bool]
) -> dict[str, str]:
    """Re-judge every adapter of one server from the index's copies; the new phase of each whose phase changed.
    API calls: one GET per pod the index lacks (not per adapter), one status patch per adapter that changed. The
    patches run `ROLLUP_CONCURRENCY` at a time on the executor: one after another, a server's thousand adapters
    would wait a thousand round trips; more at once would leave the executor no thread for other handlers."""
    bodies = [freshest(memo, entry.body) for entry in adapters if entry.body is not None and not _deleting(entry.body)]
    missing = set().union(*map(named_pods, bodies)) - set(pods)
    resolved = await memo.call(resolve_pods, api=memo.api, namespace=key[0], server=key[1], names=missing)
    slots = asyncio.Semaphore(ROLLUP_CONCURRENCY)

    async def one(body: Mapping[str, Any]) -> str | None:
        own = {pod: ready for pod, ready in resolved.items() if pod in named_pods(body)}
        async with slots:
            return await memo.call(
                rollup_adapter, memo=memo, body=body, server_exists=server_exists, pods={**pods, **own}
            )

    phases = await asyncio.gather(*(one(body) for body in bodies))
    return {body["metadata"]["name"]: phase for body, phase in zip(bodies, phases, strict=True) if phase}


def _deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


async def recount(
    *,
    memo: Context,
    servers: list[ServerKey],
    adapters_index: indexes.AdaptersIndex,
    new_phases: Mapping[str, str],
) -> None:
    """Rewrite the adapter counts of the servers whose adapters just changed phase, so they follow at once (with the
    phases just written, which the index may not have yet: see indexes.adapter_phases).

    Coalesced: while one recount of a server waits for its lock, later ones return at once, because the waiting
    one reads every phase written before it gets the lock. Hundreds of adapters changing phase together then cost
    a couple of count writes instead of one each, and their handlers do not queue on the lock (which held back kopf's
    processing of their next events, and with it the adapters' index)."""
    if not new_phases:
        return
    for server in servers:

        async def count(server: ServerKey = server) -> None:
            adapters = indexes.adapter_phases(memo, adapters_index, server)
            await memo.call(model_servers.write_counts, memo=memo, key=server, adapters=adapters)

        await _coalesced(memo, memo.recounts_waiting, server, count)


async def _coalesced(
    memo: Context, waiting: set[ServerKey], key: ServerKey, work: Callable[[], Awaitable[None]]
) -> None:
    """`work` under the server's lock, unless a caller of the same `waiting` set is already waiting for the lock:
    that one reads the state once it has the lock, after every change made so far, so this one returns at once."""
    if key in waiting:
        return
    waiting.add(key)
    try:
        async with memo.locks[key]:
            waiting.discard(key)  # from here on the state is read: later changes need another run
            await work()
    finally:
        waiting.discard(key)


async def _rejudge_server_adapters(
    *,
    memo: Context,
    key: ServerKey,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
) -> None:
    servers = indexes.servers(model_servers_index, key)
    new_phases = await rollup_server_adapters(
        memo=memo,
        key=key,
        adapters=indexes.adapters(adapters_index, key),
        server_exists=bool(servers),
        pods=indexes.pods(pods_index, key),
    )
    await recount(memo=memo, servers=servers, adapters_index=adapters_index, new_phases=new_phases)


def _follows_adapters(memo: Context, key: ServerKey, adapters: list[indexes.AdapterEntry]) -> bool:
    """Whether the server's last reconcile rendered from the adapters as they are: its Role grants the Secrets they
    name, and (routed through a gateway) its body-based router ConfigMap lists the names they are served by."""
    if indexes.adapter_secrets(adapters) != memo.granted_secrets.get(key, frozenset()):
        return False
    routed = memo.routed_adapters.get(key)
    return routed is None or routed == indexes.served_adapters(adapters)


async def follow_adapters(
    *, memo: Context, namespace: str, servers_index: indexes.ServersIndex, adapters_index: indexes.AdaptersIndex
) -> None:
    """Reconcile the servers of the namespace whose adapters changed what they render (an adapter added, deleted,
    moved to another server, renamed, failed or recovered, or naming another Secret), so the Role grant and the
    body-based router's adapter list follow at once. Coalesced as recounts are: while one waits for the server's
    lock, the others go on at once, because the waiting one reads the adapters when it gets the lock. Before a
    server's first reconcile in this process nothing is granted yet, so after a restart every adapter event queued a
    whole reconcile ahead of its own roll-up."""
    for key in [key for key in servers_index if key[0] == namespace]:
        if not _follows_adapters(memo, key, indexes.adapters(adapters_index, key)):
            work = functools.partial(model_servers.reconcile_locked, memo=memo, key=key, adapters_index=adapters_index)
            await _coalesced(memo, memo.adapter_followers_waiting, key, work)


async def adapter_changed(
    event: kopf.RawEvent,
    body: kopf.Body,
    namespace: str,
    spec: kopf.Spec,
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
    **_: Any,
) -> None:
    await follow_adapters(
        memo=memo, namespace=namespace, servers_index=model_servers_index, adapters_index=adapters_index
    )
    if event.get("type") == "DELETED":
        memo.written_statuses.pop((namespace, body["metadata"]["name"]), None)
        await memo.call(record_deleted, memo=memo, body=dict(body))
        return
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    key = (namespace, spec.get("modelServer", ""))
    servers = indexes.servers(model_servers_index, key)
    pods = indexes.pods(pods_index, key)
    new_phase = await memo.call(observe_and_rollup, memo=memo, body=dict(body), server_exists=bool(servers), pods=pods)
    if new_phase:
        new_phases = {body["metadata"]["name"]: new_phase}
        await recount(memo=memo, servers=servers, adapters_index=adapters_index, new_phases=new_phases)


async def pod_event(
    labels: kopf.Labels,
    namespace: str,
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
    **_: Any,
) -> None:
    """A server pod came, went, or changed readiness: re-judge its server's adapters (and prune gone pods).
    Its other changes (container statuses, annotations...) leave the server's pods -> ready as they were, and
    with them every adapter's roll-up: those events cost nothing."""
    key = (namespace, labels.get(naming.LABEL_SERVER, ""))
    pods = indexes.pods(pods_index, key)
    if memo.judged_pods.get(key) == pods:
        return
    await _rejudge_server_adapters(
        memo=memo,
        key=key,
        model_servers_index=model_servers_index,
        adapters_index=adapters_index,
        pods_index=pods_index,
    )
    memo.judged_pods[key] = pods


async def model_server_event(
    event: kopf.RawEvent,
    name: str,
    namespace: str,
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
    **_: Any,
) -> None:
    """A server appeared or went away: its adapters' phases may flip (ModelServerNotFound)."""
    if event.get("type") in ("ADDED", "DELETED", None):
        await _rejudge_server_adapters(
            memo=memo,
            key=(namespace, name),
            model_servers_index=model_servers_index,
            adapters_index=adapters_index,
            pods_index=pods_index,
        )
