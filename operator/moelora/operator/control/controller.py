"""One pass over one ModelServer, the only work the keyed queue runs (workqueue.py, fed by mappers.py): observe,
plan, apply.

Observe: the server's share of kopf's indexes, read at once in the event loop, with this operator's own writes
(decide/expectations.py); then, for the adapters whose judgement moved, what their roll-ups read from the API (pods
the index lacks, the server's S3 endpoint). Plan: decide/plan.py, pure. Apply: the server's reconcile
(model_servers.reconcile: its children and status) or its adapter counts, then the placements, the adapters' routes
and the roll-ups. The pass returns the seconds after which it wants its key again (a drain time ending), like
controller-runtime's RequeueAfter.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

from moelora.operator.control import lora_adapters, model_servers, placement_writes, route_writes
from moelora.operator.control.context import Context, wall_clock
from moelora.operator.decide import indexes, plan
from moelora.operator.decide.expectations import ServerKey

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Indexes:
    """kopf's indexes, as its handlers receive them (live views, filled as its watches run)."""

    servers: indexes.ServersIndex
    adapters: indexes.AdaptersIndex
    pods: indexes.PodsIndex
    placement: indexes.PlacementIndex
    children: tuple[indexes.ChildrenIndex, ...] = ()


async def observe(memo: Context, key: ServerKey, observed: Indexes) -> plan.Observation:
    known = memo.expectations
    # The indexes first, all at once in the event loop (they are not thread-safe), before any blocking work.
    server = indexes.server_entry(observed.servers, key)
    entries = indexes.adapters(observed.adapters, key)
    pods = indexes.pods(observed.pods, key)
    children = indexes.children(observed.children, key)
    placed = indexes.placed_server(observed.placement, key)
    moved = []
    for entry in entries:
        if entry.body is None or lora_adapters.deleting(entry.body):
            continue
        adapter = (key[0], entry.name)
        inputs = plan.judgement(entry.body, written=known.written_version(adapter), server=server, pods=pods)
        if known.judged(adapter) != inputs:
            moved.append((known.freshest(entry.body), inputs))
    reads: list[tuple[dict[str, bool], str | None]] = []
    if moved:
        bodies = [body for body, _ in moved]
        reads = await memo.call(
            lora_adapters.observe, memo=memo, key=key, bodies=bodies, pods=pods, server_exists=server is not None
        )
    judge = [
        plan.ToJudge(body=body, inputs=inputs, pods=own, refused=refused, remember=own.keys() == pods.keys())
        for (body, inputs), (own, refused) in zip(moved, reads, strict=True)
    ]
    return plan.Observation(
        key=key,
        server=server,
        children=children,
        adapters=indexes.adapter_phases(known, key[0], entries),
        placed=placed,
        known=known.server(key),
        judge=judge,
        now=time.time(),
        wall=wall_clock(),
        pods=pods,
    )


async def apply(memo: Context, key: ServerKey, planned: plan.Plan) -> None:
    """The server first, so a StatefulSet scaled up has its pods before placements name them; the adapters' writes
    then go ahead even when the server's fail (its error is raised after them, and the queue retries the pass)."""
    failed: Exception | None = None
    try:
        await apply_server(memo, key, planned)
    except Exception as exc:  # noqa: BLE001 - raised below, once the adapters' writes are done
        failed = exc
    written = planned.placements
    done: list[str] = []
    if written.changes:
        done = await memo.call(
            placement_writes.write_placements,
            memo=memo,
            namespace=key[0],
            placements=written.changes,
            cleared=written.cleared,
        )
        logger.info("placement of %d adapter(s) of %s/%s written", len(done), *key)
    memo.expectations.update_server(
        key,
        placements={**written.kept.placements, **{name: written.changes[name] for name in done}},
        cleared={**written.kept.cleared, **{pair: at for pair, at in written.loaded.items() if pair[0] in done}},
    )
    if planned.routes:
        routed = await memo.call(
            route_writes.write_routes,
            memo=memo,
            namespace=key[0],
            server=key[1],
            routes=planned.routes,
            adapters=planned.adapters,
        )
        present = {entry.name for entry in planned.adapters}
        known = memo.expectations.server(key).routes
        kept = {name: value for name, value in known.items() if name in present}
        memo.expectations.update_server(key, routes={**kept, **routed})
    await lora_adapters.write_rollups(memo=memo, key=key, rollups=planned.rollups)
    if failed is not None:
        raise failed


async def apply_server(memo: Context, key: ServerKey, planned: plan.Plan) -> None:
    if planned.counts is None:  # the server is gone
        memo.expectations.forget_rendered(key)
        memo.metrics.set_children(key, None)
    elif planned.reconcile is not None:
        rendered = planned.reconcile
        await memo.call(
            model_servers.reconcile,
            memo=memo,
            key=key,
            adapters=planned.adapters,
            assigned_pods=rendered.assigned_pods,
            placement_short=rendered.short,
        )
        memo.expectations.update_server(key, rendered=rendered, counted=planned.counts)
    elif planned.write_counts:
        await memo.call(model_servers.write_counts, memo=memo, key=key, adapters=planned.adapters)
        memo.expectations.update_server(key, counted=planned.counts)


async def process(key: ServerKey, *, memo: Context, observed: Indexes) -> float | None:
    """One pass over the server `key`; the seconds after which it wants another, or None."""
    planned = plan.plan(await observe(memo, key, observed))
    await apply(memo, key, planned)
    return planned.again


async def start(
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
    placement_index: indexes.PlacementIndex,
    deployments_index: indexes.ChildrenIndex,
    statefulsets_index: indexes.ChildrenIndex,
    claims_index: indexes.ChildrenIndex,
    jobs_index: indexes.ChildrenIndex,
    **_: Any,
) -> None:
    """kopf startup activity: start the queue's workers on kopf's indexes."""
    observed = Indexes(
        servers=model_servers_index,
        adapters=adapters_index,
        pods=pods_index,
        placement=placement_index,
        children=(deployments_index, statefulsets_index, claims_index, jobs_index),
    )
    memo.queue.start(functools.partial(process, memo=memo, observed=observed))


async def stop(memo: Context, **_: Any) -> None:
    """kopf cleanup activity: stop the workers."""
    await memo.queue.stop()
