"""Placement: keep each adapter's `status.placement` of a placed ModelServer current (assignment.py).

Each pass of a server (controller.py: an agent reporting loaded, an adapter added, deleted or resized, the server
scaled) recomputes every adapter's assignment from kopf's indexes and writes only those that changed. When the pods
the assignments name change (a scale-down whose moves have finished), or the copies no pod has room for, the pass
reconciles the server so its StatefulSet and its Degraded condition follow. A drain time that ends brings no
event: the pass asks for its key again then.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from moelora.api import AdapterPlacement
from moelora.operator import apply, assignment, indexes
from moelora.operator.context import Context, ServerKey

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


async def place(
    *, memo: Context, key: ServerKey, server: assignment.Server | None, adapters: list[indexes.AdapterEntry]
) -> float | None:
    """Recompute the server's assignments and write those that changed. Seconds until a drain time ends, when they
    must be judged again (no event comes then), or None."""
    known = memo.expectations.server(key)
    states = [entry.placed for entry in adapters if entry.placed is not None]
    names = {state.name for state in states}
    written = {name: placed for name, placed in known.placements.items() if name in names}
    stale = {pair: at for pair, at in known.cleared.items() if pair[0] in names}
    if server is None and not any(written.get(state.name, state.current) for state in states):
        memo.expectations.update_server(key, placements={}, cleared={})
        return None  # not placed, and nothing assigned to clear
    # The index learns our writes only when their events come back: what we wrote last is the newer truth, and
    # an entry we cleared still reads loaded there until then (a fresh load has another loadedAt).
    states = [
        dataclasses.replace(
            state,
            current=written.get(state.name, state.current),
            loaded_on={pod: at for pod, at in state.loaded_on.items() if stale.get((state.name, pod)) != at},
        )
        for state in states
    ]
    new: dict[str, AdapterPlacement | None]
    recheck = None
    if server is None:  # placement turned off (or the server gone): clear what an earlier one assigned
        new = {state.name: None for state in states}
    else:
        assigned, recheck = assignment.assign(server, states, now=time.time())
        new = dict(assigned)
    changes = {state.name: new[state.name] for state in states if state.current != new[state.name]}
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
    memo.expectations.update_server(key, placements=written, cleared=stale)
    # A little after the drain time ends, so the judgement then finds it ended.
    return None if recheck is None else max(0.0, recheck - time.time()) + 0.1
