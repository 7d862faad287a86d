"""Placement handlers: keep each adapter's `status.placement` of a placed ModelServer current (assignment.py).

Every event of a server's adapters (an agent reporting loaded, an adapter added, deleted or resized) and of the
server itself (a scale) leads to `place_server`, which recomputes every adapter's assignment from kopf's indexes
and writes only those that changed. When the pods the assignments name change (a scale-down whose moves have
finished), the server is reconciled so its StatefulSet follows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from moelora.api import AdapterPlacement
from moelora.operator import apply, assignment, indexes
from moelora.operator.context import Context, ServerKey
from moelora.operator.model_servers import reconcile_serially

logger = logging.getLogger(__name__)


def write_placements(*, memo: Context, namespace: str, placements: Mapping[str, AdapterPlacement | None]) -> list[str]:
    """Patch each adapter's status.placement (None removes it); the adapters written (gone ones are skipped)."""
    written = []
    for name, new in placements.items():
        value = None if new is None else new.model_dump(mode="json", by_alias=True)
        patched = apply.patch_status(
            api=memo.api, plural="loraadapters", namespace=namespace, name=name, status={"placement": value}
        )
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
        for gone in set(written) - {state.name for state in states}:
            del written[gone]
        # The index learns our writes only when their events come back: what we wrote last is the newer truth.
        states = [
            dataclasses.replace(state, current=written[state.name]) if state.name in written else state
            for state in states
        ]
        before = assignment.pods_needed((state.assigned for state in states), server=key[1])
        new: dict[str, AdapterPlacement | None]
        if server is None:  # placement turned off (or the server gone): clear what an earlier one assigned
            new = {state.name: None for state in states}
        else:
            new = dict(assignment.assign(server, states))
        changes = {state.name: new[state.name] for state in states if state.current != new[state.name]}
        after = assignment.pods_needed((p.replicas for p in new.values() if p is not None), server=key[1])
        if changes:
            done = await memo.call(write_placements, memo=memo, namespace=key[0], placements=changes)
            written.update({name: changes[name] for name in done})
            logger.info("placement of %d adapter(s) of %s/%s written", len(done), *key)
    if server is not None and before != after:
        await reconcile_serially(memo=memo, key=key, adapters_index=adapters_index)


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
