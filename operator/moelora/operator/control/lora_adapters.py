"""LoRAAdapter roll-ups, the I/O half: what a roll-up reads beyond kopf's index (pods the index lacks, policy's verdict
on the source), and the status patches and Events a pass's plan decided (decide/rollup.py judges them), in each pass
of its server (controller.py): whenever the adapter, a server pod, or the server changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import kubernetes.client
import pydantic

from moelora.api import AdapterSource, S3Spec
from moelora.operator import policy
from moelora.operator.control import metrics
from moelora.operator.control.context import API_THREADS, Context, wall_clock
from moelora.operator.decide import status
from moelora.operator.decide.expectations import ServerKey
from moelora.operator.decide.rollup import DELETED, named_pods
from moelora.operator.kube import apply, events
from moelora.operator.render import naming

if TYPE_CHECKING:
    from moelora.operator.decide import plan

# Status patches of one server's adapters in flight at once: half the executor's threads, the rest for other handlers.
ROLLUP_CONCURRENCY = API_THREADS // 2


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


def source_refusal(*, memo: Context, body: Mapping[str, Any]) -> str | None:
    """Why policy refuses the adapter's source, judged with its server's endpoint; None when allowed, or when the
    spec or the server cannot be read (other reasons report those). The server is read only for an adapter naming
    an endpoint of its own: the rest need only the bucket rule, so a roll-up costs no read per adapter."""
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


def observe(
    *, memo: Context, key: ServerKey, bodies: list[Mapping[str, Any]], pods: Mapping[str, bool], server_exists: bool
) -> list[tuple[dict[str, bool], str | None]]:
    """What each adapter's roll-up reads beyond kopf's index: the server's pods with those its status names that the
    index lacks but the API server still has (one GET per such pod, not per adapter), and why policy refuses its
    source."""
    missing = set().union(*map(named_pods, bodies)) - set(pods)
    resolved = resolve_pods(api=memo.api, namespace=key[0], server=key[1], names=missing)
    return [
        (
            {**pods, **{pod: ready for pod, ready in resolved.items() if pod in named_pods(body)}},
            source_refusal(memo=memo, body=body) if server_exists else None,
        )
        for body in bodies
    ]


@metrics.timed("LoRAAdapter")
def write_rollup(*, memo: Context, rollup: plan.Rollup) -> None:
    """Write one adapter's roll-up (decide/plan.py), remember the write, then post its Event once the patch is
    stored."""
    meta = rollup.body["metadata"]
    stored = apply.patch_status(
        api=memo.api, plural="loraadapters", namespace=meta["namespace"], name=meta["name"], status=rollup.patch
    )
    if stored is None:
        return  # gone
    memo.expectations.status_written((meta["namespace"], meta["name"]), stored)
    if rollup.emission is not None:
        memo.events.record(
            api=memo.api, involved=events.adapter_reference(meta), emission=rollup.emission, now=wall_clock()
        )


async def write_rollups(*, memo: Context, key: ServerKey, rollups: list[plan.Rollup]) -> None:
    """Apply a pass's roll-ups: the patches run `ROLLUP_CONCURRENCY` at a time on the executor (one after another,
    a server's thousand adapters would wait a thousand round trips; more at once would leave the executor no thread
    for other servers' passes); an adapter judged with nothing to write is remembered, so the same inputs are not
    judged again."""
    slots = asyncio.Semaphore(ROLLUP_CONCURRENCY)

    async def one(rollup: plan.Rollup) -> None:
        if not rollup.patch:
            if rollup.remember:
                memo.expectations.judged_with_nothing_to_write((key[0], rollup.body["metadata"]["name"]), rollup.inputs)
            return
        async with slots:
            await memo.call(write_rollup, memo=memo, rollup=rollup)

    await asyncio.gather(*(one(rollup) for rollup in rollups))


def record_deleted(*, memo: Context, body: Mapping[str, Any]) -> None:
    """The Deleted Event of an adapter gone from the API server."""
    involved = events.adapter_reference(body["metadata"])
    memo.events.record(api=memo.api, involved=involved, emission=DELETED, now=wall_clock())


def deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))
