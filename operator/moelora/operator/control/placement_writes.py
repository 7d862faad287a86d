"""Placement's writes: each adapter's `status.placement` of a placed ModelServer (decide/assignment.py decides them).

Each pass of a server (controller.py: an agent reporting loaded, an adapter added, deleted or resized, the server
scaled) recomputes every adapter's assignment from kopf's indexes (plan.place) and writes only those that changed.
When the pods the assignments name change (a scale-down whose moves have finished), or the copies no pod has room
for, the pass reconciles the server so its StatefulSet and its Degraded condition follow. A drain time that ends
brings no event: the pass asks for its key again then.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from moelora.api import AdapterPlacement
from moelora.operator.control.context import Context
from moelora.operator.kube import apply

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
