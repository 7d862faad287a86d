"""One pass over one ModelServer, the only work the keyed queue runs (workqueue.py, fed by mappers.py).

A pass observes the server's share of kopf's indexes, then: places its adapters (with spec.placement), rolls up
the adapters whose inputs moved, and reconciles the server's children and status when something they are rendered
from moved since its last reconcile (its spec, a child it watches, its adapters' Secrets or router names, the pods
placement assigns), else writes its adapter counts when they moved. It returns the seconds after which it wants its
key again (a drain time ending), like controller-runtime's RequeueAfter.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple

from moelora.operator import indexes, lora_adapters, model_servers, placements, status
from moelora.operator.context import Context, ServerKey

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Indexes:
    """kopf's indexes, as its handlers receive them (live views, filled as its watches run)."""

    servers: indexes.ServersIndex
    adapters: indexes.AdaptersIndex
    pods: indexes.PodsIndex
    placement: indexes.PlacementIndex
    children: tuple[indexes.ChildrenIndex, ...] = ()


class Rendered(NamedTuple):
    """What a reconcile of a server rendered from; another reconcile is due when any of it moves."""

    server: indexes.ServerEntry
    children: frozenset[indexes.ChildEntry]
    secrets: frozenset[str]  # the Secrets its Role grants
    assigned_pods: int  # pods placement's assignments name (its StatefulSet's size)
    short: tuple[int, int]  # (adapters, copies) placement found no room for (its Degraded condition)


@dataclasses.dataclass(frozen=True, kw_only=True)
class View:
    """One server's share of the indexes, read at once in the event loop."""

    server: indexes.ServerEntry | None
    children: frozenset[indexes.ChildEntry]
    adapters: list[indexes.AdapterEntry]
    pods: dict[str, bool]
    placed: Any  # assignment.Server | None


def view(observed: Indexes, key: ServerKey) -> View:
    return View(
        server=indexes.server_entry(observed.servers, key),
        children=indexes.children(observed.children, key),
        adapters=indexes.adapters(observed.adapters, key),
        pods=indexes.pods(observed.pods, key),
        placed=indexes.placed_server(observed.placement, key),
    )


def rendered_from(memo: Context, key: ServerKey, seen: View, server: indexes.ServerEntry) -> Rendered:
    written = memo.expectations.server(key).placements
    return Rendered(
        server=server,
        children=seen.children,
        secrets=indexes.adapter_secrets(seen.adapters),
        assigned_pods=indexes.assigned_pods(written, key[1], seen.adapters),
        short=indexes.placement_short(written, seen.adapters),
    )


def follows_adapters(memo: Context, key: ServerKey, adapters: list[indexes.AdapterEntry]) -> bool:
    """Whether the server's last reconcile rendered from the adapters as they are: its Role grants the Secrets they
    name, and (routed through a gateway) its body-based router ConfigMap lists the names they are served by."""
    known = memo.expectations.server(key)
    if known.rendered is None or known.rendered.secrets != indexes.adapter_secrets(adapters):
        return False
    return known.routed is None or known.routed == indexes.served_adapters(adapters)


async def process(key: ServerKey, *, memo: Context, observed: Indexes) -> float | None:
    """One pass over the server `key`; the seconds after which it wants another, or None."""
    seen = view(observed, key)
    again = await placements.place(memo=memo, key=key, server=seen.placed, adapters=seen.adapters)
    server = seen.server
    await lora_adapters.rollup_server_adapters(
        memo=memo,
        key=key,
        adapters=seen.adapters,
        server_exists=server is not None,
        pods=seen.pods,
        server_generation=server.generation if server is not None else 0,
    )
    if server is None:  # gone (or not yet in the index): its adapters say so; the garbage collector takes the rest
        forget(memo, key)
        memo.metrics.set_children(key, None)
        return again
    adapters = indexes.adapter_phases(memo.expectations, key[0], seen.adapters)
    counts = status.adapter_counts([entry.phase for entry in adapters]).to_wire()
    rendered = rendered_from(memo, key, seen, server)
    known = memo.expectations.server(key)
    if known.rendered != rendered or not follows_adapters(memo, key, seen.adapters):
        await memo.call(model_servers.reconcile, memo=memo, key=key, adapters=adapters)
        memo.expectations.update_server(key, rendered=rendered, counted=counts)
    elif known.counted != counts:
        await memo.call(model_servers.write_counts, memo=memo, key=key, adapters=adapters)
        memo.expectations.update_server(key, counted=counts)
    return again


def forget(memo: Context, key: ServerKey) -> None:
    """What this operator knows of a server's last reconcile; its next pass reconciles it from scratch."""
    memo.expectations.forget_rendered(key)


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
