"""kopf's handlers, thin: each maps an event onto the keys of the ModelServers it concerns and queues them
(controller.py runs the passes). kopf runs one object's handlers one after another, so a handler that returns at
once keeps the object's next events, and the indexes they update, from waiting behind a reconcile.
"""

from __future__ import annotations

from typing import Any

import kopf

from moelora.operator.control import lora_adapters
from moelora.operator.control.context import Context
from moelora.operator.decide import indexes, plan
from moelora.operator.render import naming


async def server_event(name: str, namespace: str, memo: Context, **_: Any) -> None:
    """The server itself: created, changed (spec, scale), resumed at start, deleted, or its status written."""
    memo.queue.add((namespace, name))


async def child_event(labels: kopf.Labels, namespace: str, memo: Context, **_: Any) -> None:
    """A Deployment, StatefulSet, model cache claim or fill Job it owns changed (rollout progress, readiness,
    binding, the fill finishing, deletion), or one of its pods (readiness: its adapters' roll-ups)."""
    server = labels.get(naming.LABEL_SERVER)
    if server:
        memo.queue.add((namespace, server))


async def adapter_event(
    event: kopf.RawEvent,
    body: kopf.Body,
    namespace: str,
    spec: kopf.Spec,
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    **_: Any,
) -> None:
    """An adapter changed: its server's pass rolls it up, places it and counts it. The other servers of the
    namespace whose last reconcile rendered from other adapters than theirs now (one moved away, or named another
    Secret) are queued too, so their Role grant and router list follow at once."""
    server = spec.get("modelServer")
    if server:
        memo.queue.add((namespace, server))
    for key in [key for key in model_servers_index if key[0] == namespace and key[1] != server]:
        if not plan.follows_adapters(memo.expectations.server(key), indexes.adapters(adapters_index, key)):
            memo.queue.add(key)
    if event.get("type") == "DELETED":
        memo.expectations.forget_adapter((namespace, body["metadata"]["name"]))
        await memo.call(lora_adapters.record_deleted, memo=memo, body=dict(body))
