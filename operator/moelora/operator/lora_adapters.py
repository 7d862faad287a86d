"""LoRAAdapter roll-ups: the operator's share of an adapter's status, rolled up from the per-pod states its server's
agents write, in each pass of its server (controller.py): whenever the adapter, a server pod, or the server changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Collection, Hashable, Mapping
from typing import Any

import kubernetes.client
import pydantic

from moelora.api import AdapterSource, S3Spec
from moelora.operator import apply, events, metrics, naming, policy, status
from moelora.operator.context import API_THREADS, Context, ServerKey, wall_clock
from moelora.operator.expectations import resource_version
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
    `pods` must already hold every pod the adapter's status names that still exists (see rollup_server_adapters)."""
    body = memo.expectations.freshest(body)
    refused = source_refusal(memo=memo, body=body) if server_exists else None
    observation = Observation(body=body, server_exists=server_exists, pods=pods, refused=refused)
    patch = render_status_patch(observation, now=wall_clock())
    if not patch:
        return None
    meta = body["metadata"]
    stored = apply.patch_status(
        api=memo.api, plural="loraadapters", namespace=meta["namespace"], name=meta["name"], status=patch
    )
    if stored is not None:  # two roll-ups of one adapter may finish out of order: the later write is kept
        memo.expectations.status_written((meta["namespace"], meta["name"]), stored)
    emission = events.adapter_transition(body.get("status") or {}, patch)
    if stored is not None and emission is not None:
        memo.events.record(api=memo.api, involved=events.adapter_reference(meta), emission=emission, now=wall_clock())
    return patch.get("phase")


def record_deleted(*, memo: Context, body: Mapping[str, Any]) -> None:
    """The Deleted Event of an adapter gone from the API server."""
    involved = events.adapter_reference(body["metadata"])
    memo.events.record(api=memo.api, involved=involved, emission=events.DELETED, now=wall_clock())


def judgement(
    memo: Context, body: Mapping[str, Any], *, server_exists: bool, server_generation: int, pods: Mapping[str, bool]
) -> Hashable:
    """What an adapter's roll-up is judged from, as one value: the index's copy and this operator's newer write
    (Expectations.freshest) by their versions, whether its server exists and at which spec, the server's pods.
    Judged once with nothing (more) to write, the same value needs no judging again."""
    meta = body["metadata"]
    return (
        resource_version(body),
        memo.expectations.written_version((meta["namespace"], meta["name"])),
        server_exists,
        server_generation,
        frozenset(pods.items()),
    )


async def rollup_server_adapters(
    *,
    memo: Context,
    key: ServerKey,
    adapters: list[AdapterEntry],
    server_exists: bool,
    pods: Mapping[str, bool],
    server_generation: int = 0,
) -> dict[str, str]:
    """Re-judge the server's adapters from the index's copies; the new phase of each whose phase changed. Adapters
    whose `judgement` is the one judged last time with nothing to write are skipped, so a pass costs no work per
    unchanged adapter. API calls: one GET per pod the index lacks (not per adapter), one status patch per adapter
    that changed. The patches run `ROLLUP_CONCURRENCY` at a time on the executor: one after another, a server's
    thousand adapters would wait a thousand round trips; more at once would leave the executor no thread for other
    servers' passes."""
    bodies = []
    for entry in adapters:
        if entry.body is None or _deleting(entry.body):
            continue
        judged = judgement(
            memo, entry.body, server_exists=server_exists, server_generation=server_generation, pods=pods
        )
        if memo.expectations.judged((key[0], entry.name)) != judged:
            bodies.append((memo.expectations.freshest(entry.body), judged))
    missing = set().union(*(named_pods(body) for body, _ in bodies)) - set(pods)
    resolved = await memo.call(resolve_pods, api=memo.api, namespace=key[0], server=key[1], names=missing)
    slots = asyncio.Semaphore(ROLLUP_CONCURRENCY)

    async def one(body: Mapping[str, Any], judged: Hashable) -> str | None:
        own = {pod: ready for pod, ready in resolved.items() if pod in named_pods(body)}
        async with slots:
            phase = await memo.call(
                rollup_adapter, memo=memo, body=body, server_exists=server_exists, pods={**pods, **own}
            )
        if not own:  # judged from the index alone: the same judgement next time writes nothing
            memo.expectations.judged_with_nothing_to_write((key[0], body["metadata"]["name"]), judged)
        return phase

    phases = await asyncio.gather(*(one(body, judged) for body, judged in bodies))
    return {body["metadata"]["name"]: phase for (body, _), phase in zip(bodies, phases, strict=True) if phase}


def _deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))
