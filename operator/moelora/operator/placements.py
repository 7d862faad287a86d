"""Placement handlers: keep each adapter's `status.placement` of a placed ModelServer current (assignment.py).

Every event of a server's adapters (an agent reporting loaded, an adapter added, deleted or resized) and of the
server itself (a scale) leads to `place_server`, which recomputes every adapter's assignment from kopf's indexes
and writes only those that changed. When the pods the assignments name change (a scale-down whose moves have
finished), or the copies no pod has room for, the server is reconciled so its StatefulSet and its Degraded
condition follow. A drain time that ends brings no event, so a timer
per server runs it again then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

import kopf

from moelora.api import AdapterPlacement
from moelora.operator import apply, assignment, indexes
from moelora.operator.context import Context, ServerKey
from moelora.operator.model_servers import reconcile_serially

logger = logging.getLogger(__name__)


def write_placements(
    *,
    memo: Context,
    namespace: str,
    placements: Mapping[str, AdapterPlacement | None],
    cleared: Mapping[str, Collection[str]],
) -> list[str]:
    """Patch each adapter's status.placement (None removes it), with the `cleared` pods' entries of
    status.replicas removed in the same patch; the adapters written (gone ones are skipped)."""
    written = []
    for name, new in placements.items():
        value = None if new is None else new.model_dump(mode="json", by_alias=True)
        status: dict[str, Any] = {"placement": value}
        if cleared.get(name):
            status["replicas"] = dict.fromkeys(cleared[name])
        patched = apply.patch_status(api=memo.api, plural="loraadapters", namespace=namespace, name=name, status=status)
        if patched is not None:
            written.append(name)
    return written


async def place_server(
    *, memo: Context, key: ServerKey, placement_index: indexes.PlacementIndex, adapters_index: indexes.AdaptersIndex
) -> None:
    """Recompute the server's assignments and write those that changed, one computation per server at a time."""
    server = indexes.placed_server(placement_index, key)
    async with memo.placement_locks[key]:
        written = memo.written_placements[key]
        states = [entry.placed for entry in indexes.adapters(adapters_index, key) if entry.placed is not None]
        names = {state.name for state in states}
        for gone in set(written) - names:
            del written[gone]
        for pair in [pair for pair in memo.stale_loads[key] if pair[0] not in names]:
            del memo.stale_loads[key][pair]
        # The index learns our writes only when their events come back: what we wrote last is the newer truth, and
        # an entry we cleared still reads loaded there until then (a fresh load has another loadedAt).
        stale = memo.stale_loads[key]
        states = [
            dataclasses.replace(
                state,
                current=written.get(state.name, state.current),
                loaded_on={pod: at for pod, at in state.loaded_on.items() if stale.get((state.name, pod)) != at},
            )
            for state in states
        ]
        before = assignment.pods_needed((state.assigned for state in states), server=key[1])
        short_before = {state.name: state.current.short for state in states if state.current and state.current.short}
        new: dict[str, AdapterPlacement | None]
        recheck = None
        if server is None:  # placement turned off (or the server gone): clear what an earlier one assigned
            new = {state.name: None for state in states}
        else:
            assigned, recheck = assignment.assign(server, states, now=time.time())
            new = dict(assigned)
        changes = {state.name: new[state.name] for state in states if state.current != new[state.name]}
        after = assignment.pods_needed((p.replicas for p in new.values() if p is not None), server=key[1])
        short_after = {name: p.short for name, p in new.items() if p is not None and p.short}
        # A pod newly assigned has not loaded the adapter: an entry it left from an earlier stint is stale.
        by_name = {state.name: state for state in states}
        cleared = {
            name: [pod for pod in placed.replicas if pod not in by_name[name].assigned]
            for name, placed in changes.items()
            if placed is not None
        }
        if changes:
            done = await memo.call(write_placements, memo=memo, namespace=key[0], placements=changes, cleared=cleared)
            written.update({name: changes[name] for name in done})
            for name in done:
                for pod in cleared.get(name, ()):
                    if pod in by_name[name].loaded_on:
                        stale[(name, pod)] = by_name[name].loaded_on[pod]
            logger.info("placement of %d adapter(s) of %s/%s written", len(done), *key)
    if recheck is not None:
        _judge_again(memo=memo, key=key, at=recheck, placement_index=placement_index, adapters_index=adapters_index)
    # The StatefulSet follows the pods the assignments name; the server's Degraded condition, the copies short.
    if server is not None and (before != after or short_before != short_after):
        await reconcile_serially(memo=memo, key=key, adapters_index=adapters_index)


def _judge_again(
    *,
    memo: Context,
    key: ServerKey,
    at: float,
    placement_index: indexes.PlacementIndex,
    adapters_index: indexes.AdaptersIndex,
) -> None:
    """Run place_server again at `at` (epoch seconds), when a drain time ends: no event comes then. One timer per
    server, the earliest wins."""
    loop = asyncio.get_running_loop()
    pending = memo.placement_timers.get(key)
    if pending is not None and not pending.cancelled() and pending.when() <= loop.time() + at - time.time():
        return
    if pending is not None:
        pending.cancel()

    def fire() -> None:
        memo.placement_timers.pop(key, None)
        task = loop.create_task(
            place_server(memo=memo, key=key, placement_index=placement_index, adapters_index=adapters_index)
        )
        memo.background.append(task)  # a reference until done, and cancelled at cleanup with the others
        task.add_done_callback(lambda done: memo.background.remove(done) if done in memo.background else None)

    memo.placement_timers[key] = loop.call_later(max(0.0, at - time.time()) + 0.1, fire)


async def adapter_event(
    spec: kopf.Spec,
    namespace: str,
    memo: Context,
    placement_index: indexes.PlacementIndex,
    adapters_index: indexes.AdaptersIndex,
    **_: Any,
) -> None:
    key = (namespace, spec.get("modelServer", ""))
    await place_server(memo=memo, key=key, placement_index=placement_index, adapters_index=adapters_index)


async def server_event(
    name: str,
    namespace: str,
    memo: Context,
    placement_index: indexes.PlacementIndex,
    adapters_index: indexes.AdaptersIndex,
    **_: Any,
) -> None:
    await place_server(memo=memo, key=(namespace, name), placement_index=placement_index, adapters_index=adapters_index)
