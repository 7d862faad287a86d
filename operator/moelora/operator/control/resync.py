"""The periodic resync: every `resync_seconds`, queue each ModelServer kopf's index knows for a whole reconcile, even
without events (drift no watch reports, a Secret that appeared).

An operator-level task, not a kopf timer: kopf puts a finalizer on every object a timer handles, so each
ModelServer's deletion would hang while the operator is down. Reconciles need no finalizer (owned children go with
their server through ownerReferences). With kopf peering, a standby replica's loop would also run; its reconciles
are idempotent (they write only on drift), so the cost is reads, and the chart's single replica never overlaps.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from moelora.operator.control.context import Context
from moelora.operator.decide import indexes


async def resync_forever(*, memo: Context, model_servers_index: indexes.ServersIndex) -> None:
    while True:
        await asyncio.sleep(memo.settings.resync_seconds)
        for key in list(model_servers_index):
            memo.expectations.forget_rendered(key)  # look again at everything, even what no event said moved
            memo.queue.add(key)


async def start(memo: Context, model_servers_index: indexes.ServersIndex, **_: Any) -> None:
    """kopf startup activity: start the loop (kopf's indexes are live views, filled as its watches run)."""
    task = asyncio.create_task(
        resync_forever(memo=memo, model_servers_index=model_servers_index), name="moelora-resync"
    )
    memo.background.append(task)


async def stop(memo: Context, **_: Any) -> None:
    """kopf cleanup activity: stop the loop."""
    for task in memo.background:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    memo.background.clear()
