"""kopf wiring: the registry of every handler, kopf's settings and login, and `run`, which owns the Context."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Collection
from typing import Any

import kopf
import kubernetes.client

from moelora.api import GROUP, VERSION
from moelora.operator.control import controller, mappers, metrics, resync
from moelora.operator.control.context import Context
from moelora.operator.decide import indexes
from moelora.operator.kube import events
from moelora.operator.render import naming
from moelora.operator.settings import Settings

MODEL_SERVERS = (GROUP, VERSION, "modelservers")
LORA_ADAPTERS = (GROUP, VERSION, "loraadapters")
PODS = ("", "v1", "pods")
DEPLOYMENTS = ("apps", "v1", "deployments")
# The children whose events move a server on, each with an index of their versions (indexes.children_index).
CHILDREN = (
    (DEPLOYMENTS, "deployments_index"),
    (("apps", "v1", "statefulsets"), "statefulsets_index"),
    (("", "v1", "persistentvolumeclaims"), "claims_index"),
    (("batch", "v1", "jobs"), "jobs_index"),
)
MANAGED = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
# The API server filters what the operator lists and watches of kinds that are not its own: a cluster's other pods
# and Deployments never reach it (kopf's `labels=` on a handler only filters after the event has arrived).
MANAGED_SELECTOR = f"{naming.LABEL_MANAGED_BY}={naming.MANAGED_BY},{naming.LABEL_SERVER}"
PREFIX = "moelora.io"


def kopf_settings(*, namespaces: Collection[str]) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Keep kopf's bookkeeping in our own annotations, out of status (which is all ours and schema-checked).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.posting.level = logging.WARNING  # Events only for what a person must see, not every handler success
    settings.posting.reporting_component = events.COMPONENT  # one "From" for kopf's Events and ours
    settings.watching.connect_timeout = 10
    # Named namespaces are exact names, not patterns: no need to list/watch namespaces and CRDs (nor the RBAC).
    settings.scanning.disabled = bool(namespaces)
    for resource in (PODS, DEPLOYMENTS):
        settings.watching.label_selectors[resource] = MANAGED_SELECTOR
    return settings


def login(memo: Context, **_: Any) -> kopf.ConnectionInfo:
    """kopf's own connection, from the same configuration as our client (one source of truth)."""
    configuration: kubernetes.client.Configuration = memo.api.configuration
    header = (
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or ""
    )
    scheme, token = header.split(" ", 1) if " " in header else ("", header)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def make_registry(settings: Settings) -> kopf.OperatorRegistry:
    """All handlers in a fresh registry (no import-time registration: tests and the local stack build their own)."""
    registry = kopf.OperatorRegistry()
    # The ignores below: kopf hands a handler its indexes and the keyword arguments it names, which kopf's callback
    # protocols (every kwarg, `namespace: str | None`) cannot express.
    kopf.on.login(registry=registry)(login)
    kopf.index(*MODEL_SERVERS, registry=registry, id="model_servers_index")(indexes.model_servers_index)  # type: ignore[arg-type]
    kopf.index(*LORA_ADAPTERS, registry=registry, id="adapters_index")(indexes.adapters_index)  # type: ignore[arg-type]
    kopf.index(*PODS, labels=MANAGED, registry=registry, id="pods_index")(indexes.pods_index)  # type: ignore[arg-type]
    kopf.index(*MODEL_SERVERS, registry=registry, id="placement_index")(indexes.placement_index)  # type: ignore[arg-type]
    for resource, index_id in CHILDREN:
        kopf.index(*resource, labels=MANAGED, registry=registry, id=index_id)(indexes.children_index)  # type: ignore[arg-type]

    # The queue's workers first, then the periodic resync and the metrics (kopf runs startup activities in order).
    kopf.on.startup(registry=registry, id="queue_start")(controller.start)  # type: ignore[arg-type]
    kopf.on.cleanup(registry=registry, id="queue_stop")(controller.stop)
    # The resync is an operator-level task, not a kopf timer, which would put a finalizer on every ModelServer.
    kopf.on.startup(registry=registry, id="resync_start")(resync.start)  # type: ignore[arg-type]
    kopf.on.cleanup(registry=registry, id="resync_stop")(resync.stop)
    kopf.on.startup(registry=registry, id="metrics_start")(metrics.start)  # type: ignore[arg-type]
    kopf.on.cleanup(registry=registry, id="metrics_stop")(metrics.stop)

    # Every handler maps its event onto server keys (mappers.py). create/update/resume keep kopf's record of the
    # spec it last handled, as before; the raw events also bring deletion and status writes.
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(*MODEL_SERVERS, registry=registry, id="reconcile")(mappers.server_event)  # type: ignore[arg-type]
    kopf.on.event(*MODEL_SERVERS, registry=registry, id="server_event")(mappers.server_event)  # type: ignore[arg-type]
    kopf.on.event(*LORA_ADAPTERS, registry=registry, id="adapter_event")(mappers.adapter_event)  # type: ignore[arg-type]
    for resource, index_id in (*CHILDREN, (PODS, "pods_index")):
        kopf.on.event(*resource, labels=MANAGED, registry=registry, id=index_id.replace("_index", "_event"))(
            mappers.child_event  # type: ignore[arg-type]
        )
    return registry


def peering_priority(settings: Settings) -> int | None:
    if settings.peering is None:
        return None
    if settings.peering_priority is not None:
        return settings.peering_priority
    return random.SystemRandom().randrange(1, 2**31)  # distinct per replica: exactly one of them is active


async def run(
    *,
    settings: Settings,
    namespaces: Collection[str] = (),
    registry: kopf.OperatorRegistry | None = None,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
) -> None:
    """Run the operator until stop_flag is set. Namespaces: those given, else settings', else all."""
    namespaces = tuple(namespaces) or settings.namespaces
    context = Context.open(settings)
    try:
        await kopf.operator(
            registry=registry or make_registry(settings),
            memo=context,
            settings=kopf_settings(namespaces=namespaces),
            clusterwide=not namespaces,
            namespaces=namespaces,
            # peering_name makes kopf require the peering CRD, so pass it only when peering is asked for.
            standalone=settings.peering is None,
            peering_name=settings.peering,
            priority=peering_priority(settings),
            liveness_endpoint=settings.liveness_endpoint,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        context.close()
