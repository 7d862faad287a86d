"""kopf wiring: thin handlers that gather what exists, call the pure builders, apply, and write status once.

Every path into a ModelServer (its own create/update/resume, a resync timer, an event of the Deployment it owns)
runs the same `reconcile`, which compares desired with actual, so it is idempotent and repairs drift. Adapter
phases are rolled up from the per-pod states the agents write whenever an adapter, a server pod, or a server
changes. What only the operator can judge (unknown engine flag, missing Secret...) becomes a condition with a
reason plus one Warning Event per new reason, and leaves the running Deployment as it was.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import datetime
import functools
import logging
import pathlib
import random
import threading
from collections.abc import Collection, Mapping
from typing import Any

import kopf
import kubernetes.client
import kubernetes.config
import pydantic

from moelora.api import GROUP, VERSION, ModelServerSpec, ModelServerStatus
from moelora.operator import apply, kernel_configs, naming, status
from moelora.operator.deployment import deployment
from moelora.operator.disruption import disruption_budget
from moelora.operator.engine import SpecProblem
from moelora.operator.service import service
from moelora.operator.settings import Settings

MODEL_SERVERS = (GROUP, VERSION, "modelservers")
LORA_ADAPTERS = (GROUP, VERSION, "loraadapters")
MANAGED = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
# Children rendered only sometimes -> their name: when one is not rendered, the one we own is deleted.
OPTIONAL_CHILDREN = {
    ("v1", "ConfigMap"): kernel_configs.owned_config_map_name,  # kernels.configs=auto
    ("policy/v1", "PodDisruptionBudget"): lambda name: name,  # two replicas or more
}
PREFIX = "moelora.io"

logger = logging.getLogger(__name__)


def now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC).replace(microsecond=0)


def kube_configuration(settings: Settings) -> kubernetes.client.Configuration:
    """The API client configuration: in-cluster service account, else the kubeconfig. Touches no global state."""
    configuration = kubernetes.client.Configuration()
    if settings.kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            return configuration
        except kubernetes.config.ConfigException:
            pass
    kubernetes.config.load_kube_config(config_file=settings.kubeconfig, client_configuration=configuration)
    return configuration


# --- activities ---------------------------------------------------------------------------------------------------


def kopf_settings(*, namespaces: Collection[str]) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Keep kopf's bookkeeping in our own annotations, out of status (which is all ours and schema-checked).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.posting.level = logging.WARNING  # Events only for what a person must see, not every handler success
    settings.watching.connect_timeout = 10
    # Named namespaces are exact names, not patterns: no need to list/watch namespaces and CRDs (nor the RBAC).
    settings.scanning.disabled = bool(namespaces)
    return settings


def configure(memo: kopf.Memo, **_: Any) -> None:
    memo.api = kubernetes.client.ApiClient(kube_configuration(memo.settings))
    # The kubernetes client blocks: handlers are async (indexes are read in the loop) and do API work in a pool.
    memo.pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="moelora-api")
    memo.locks = collections.defaultdict(asyncio.Lock)
    # (namespace, server) -> {adapter: the phase this operator last wrote}; see adapter_phases.
    memo.written_phases = collections.defaultdict(dict)


def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.pool.shutdown(wait=False, cancel_futures=True)
    memo.api.close()


def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's own connection, from the same configuration as our client (one source of truth)."""
    configuration: kubernetes.client.Configuration = memo.api.configuration
    header = (
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or ""
    )
    scheme, _, token = header.partition(" ") if " " in header else ("", "", header)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


# --- indexes ------------------------------------------------------------------------------------------------------


def model_servers_index(name: str, namespace: str, **_: Any) -> dict[tuple[str, str], Any]:
    # Only which servers exist: reconcile reads the server itself when it runs.
    return {(namespace, name): {"metadata": {"name": name, "namespace": namespace}}}


def adapters_index(
    spec: kopf.Spec, status: kopf.Status, name: str, namespace: str, **_: Any
) -> dict[tuple[str, str], Any] | None:
    server = spec.get("modelServer")
    if not server:
        return None
    return {(namespace, server): {"name": name, "phase": status.get("phase") or "Pending"}}


def pods_index(
    status: kopf.Status, labels: kopf.Labels, name: str, namespace: str, **_: Any
) -> dict[tuple[str, str], Any] | None:
    server = labels.get(naming.LABEL_SERVER)
    if not server:
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return {(namespace, server): (name, ready)}


# --- ModelServer ----------------------------------------------------------------------------------------------------


def _problem_from_validation(error: pydantic.ValidationError) -> SpecProblem:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return SpecProblem("InvalidSpec", f"spec.{where}: {first['msg']}")


def desired_children(
    body: Mapping[str, Any], *, settings: Settings, api: kubernetes.client.ApiClient, bundle: Any
) -> list[dict[str, Any]]:
    """The objects the server should own. Raises SpecProblem for what the operator refuses."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    try:
        spec = ModelServerSpec.model_validate(dict(body.get("spec") or {}))
    except pydantic.ValidationError as exc:
        raise _problem_from_validation(exc) from None
    if spec.s3.credentials_secret is not None:
        secret = spec.s3.credentials_secret.name
        if apply.secret_exists(api, namespace=namespace, name=secret) is False:
            raise SpecProblem("SecretNotFound", f"S3 credentials Secret {secret!r} does not exist in {namespace}")
    user_config_map = None
    if spec.kernels.config_map_name:
        user_config_map = apply.get_config_map(api, namespace=namespace, name=spec.kernels.config_map_name)
    volume = kernel_configs.volume(
        spec, name=name, namespace=namespace, labels=naming.labels(name), root=bundle, user_config_map=user_config_map
    )
    children = [
        deployment(spec, name=name, namespace=namespace, settings=settings, kernel_configs=volume),
        service(name=name, namespace=namespace),
    ]
    if volume is not None and volume.owned_config_map is not None:
        children.insert(0, volume.owned_config_map)
    budget = disruption_budget(spec, name=name, namespace=namespace)
    if budget is not None:
        children.append(budget)
    return children


async def in_pool(memo: kopf.Memo, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Run blocking API work in the operator's pool, with the context kopf.event() needs."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        memo.pool, functools.partial(context.run, fn, *args, **kwargs)
    )


def snapshot(index: Any, key: tuple[str, str]) -> list[Any]:
    """A copy of one key of a kopf index, taken in the event loop (indexes are not thread-safe)."""
    return list(index.get(key, []))


def adapter_phases(memo: kopf.Memo, adapters_index: Any, key: tuple[str, str]) -> list[dict[str, Any]]:
    """A server's adapters with their latest phases: the index's, except where this operator has written a newer
    phase whose watch event has not come back yet (the index learns a write only then). Without this, two adapters
    failing at once could each be counted from an index that lacks the other, and the last status write would
    keep the stale count until the next resync: nothing else prompts a recount once the events have come back."""
    written = memo.written_phases[key]
    adapters = snapshot(adapters_index, key)
    for gone in set(written) - {entry["name"] for entry in adapters}:
        del written[gone]
    return [{**entry, "phase": written[entry["name"]]} if entry["name"] in written else entry for entry in adapters]


async def reconcile_serially(body: Mapping[str, Any], *, memo: kopf.Memo, adapters_index: Any) -> None:
    """One reconcile of a server at a time (its own handlers, its timer, its Deployment's events all lead here).
    Its adapters' phases are read under the lock, so a reconcile never counts with older phases than the one
    before it."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    async with memo.locks[key]:
        adapters = adapter_phases(memo, adapters_index, key)
        await in_pool(memo, reconcile, body, memo=memo, adapters=adapters)


def reconcile(body: Mapping[str, Any], *, memo: kopf.Memo, adapters: list[Any]) -> None:
    """Desired vs actual for one ModelServer, then its status, written once and only if it changed."""
    api: kubernetes.client.ApiClient = memo.api
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    # Judge the object as stored now: the triggering event's copy may predate the last reconcile's status write.
    body = apply.get(api, path=f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/modelservers/{name}")
    if body is None or body["metadata"].get("deletionTimestamp"):
        return  # gone or going: the garbage collector takes its children
    meta = body["metadata"]
    problem: SpecProblem | None = None
    actual_deployment: dict[str, Any] | None = None
    try:
        children = desired_children(body, settings=memo.settings, api=api, bundle=memo.bundle)
    except SpecProblem as exc:
        problem = exc
    else:
        # ownerReferences: deleting the server deletes them. (Not kopf.adopt: it also copies the server's labels
        # onto the children, so a label edit on the server would rewrite every child.)
        kopf.append_owner_reference(children, owner=dict(body))
        for child in children:
            obj, action = apply.ensure(api, child)
            if action != "unchanged":
                logger.info("%s %s/%s %s", child["kind"], namespace, child["metadata"]["name"], action)
            if child["kind"] == "Deployment":
                actual_deployment = obj
        rendered = {(child["apiVersion"], child["kind"]) for child in children}
        for (api_version, kind), child_name in OPTIONAL_CHILDREN.items():
            if (api_version, kind) in rendered:
                continue
            path = apply.object_path(api_version, kind, namespace=namespace, name=child_name(name))
            if apply.delete_if_owned(api, path=path, owner_uid=meta["uid"]):
                logger.info("%s %s/%s deleted", kind, namespace, child_name(name))
    if actual_deployment is None:
        actual_deployment = apply.get_deployment(api, namespace=namespace, name=name)

    raw_status = dict(body.get("status") or {})
    try:
        previous = ModelServerStatus.model_validate(raw_status)
    except pydantic.ValidationError:
        previous = ModelServerStatus()
    try:
        spec = ModelServerSpec.model_validate(dict(body.get("spec") or {}))
    except pydantic.ValidationError:
        spec = ModelServerSpec.model_construct(replicas=int((body.get("spec") or {}).get("replicas") or 0))
    phases = [entry["phase"] for entry in adapters]
    new = status.model_server_status(
        spec,
        name=name,
        namespace=namespace,
        generation=meta.get("generation"),
        deployment=actual_deployment,
        problem=problem,
        adapters=status.adapter_counts(phases),
        previous=previous,
        now=now(),
    ).to_wire()
    if problem is not None and _degraded_reason(raw_status) != problem.reason:
        kopf.event(dict(body), type="Warning", reason=problem.reason, message=problem.message)
    if any(raw_status.get(key) != value for key, value in new.items()):
        apply.patch_status(api, plural="modelservers", namespace=namespace, name=name, status=new)


def _degraded_reason(raw_status: Mapping[str, Any]) -> str | None:
    for condition in raw_status.get("conditions") or []:
        if condition.get("type") == "Degraded" and condition.get("status") == "True":
            return str(condition.get("reason"))
    return None


async def model_server_changed(
    body: kopf.Body, name: str, namespace: str, memo: kopf.Memo, adapters_index: Any, **_: Any
) -> None:
    await reconcile_serially(dict(body), memo=memo, adapters_index=adapters_index)


async def deployment_event(
    labels: kopf.Labels, namespace: str, memo: kopf.Memo, model_servers_index: Any, adapters_index: Any, **_: Any
) -> None:
    """A Deployment we own changed (rollout progress, readiness, deletion): reconcile its server."""
    server = labels.get(naming.LABEL_SERVER, "")
    for body in snapshot(model_servers_index, (namespace, server)):
        await reconcile_serially(body, memo=memo, adapters_index=adapters_index)


async def model_server_event(
    event: kopf.RawEvent,
    name: str,
    namespace: str,
    memo: kopf.Memo,
    model_servers_index: Any,
    adapters_index: Any,
    pods_index: Any,
    **_: Any,
) -> None:
    """A server appeared or went away: its adapters' phases may flip (ModelServerNotFound)."""
    key = (namespace, name)
    if event.get("type") == "DELETED" and key in memo.locks and not memo.locks[key].locked():
        del memo.locks[key]
    if event.get("type") in ("ADDED", "DELETED", None):
        servers = snapshot(model_servers_index, key)
        new_phases = await in_pool(
            memo,
            rollup_server_adapters,
            namespace,
            adapters=snapshot(adapters_index, key),
            memo=memo,
            server_exists=bool(servers),
            pods=snapshot(pods_index, key),
        )
        await recount(servers, key, memo=memo, adapters_index=adapters_index, new_phases=new_phases)


# --- LoRAAdapter ----------------------------------------------------------------------------------------------------


def rollup_adapter(body: Mapping[str, Any], *, memo: kopf.Memo, server_exists: bool, pods: list[Any]) -> str | None:
    """Write the operator's share of one adapter's status if it changed. The new phase if the phase changed."""
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    raw_status = dict(body.get("status") or {})
    known = dict(pods)
    # A pod this operator has not seen yet (its watch may lag the pod's agent) is not gone: ask before pruning.
    for pod in set(raw_status.get("replicas") or {}) - set(known):
        found = apply.get(memo.api, path=f"/api/v1/namespaces/{namespace}/pods/{pod}")
        if found is not None and (found["metadata"].get("labels") or {}).get(naming.LABEL_SERVER) == spec.get(
            "modelServer"
        ):
            known[pod] = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (found.get("status") or {}).get("conditions") or []
            )
    patch = status.adapter_status_patch(
        raw_status,
        served_name=spec.get("servedName") or meta["name"],
        generation=meta.get("generation"),
        server_exists=server_exists,
        pods=known,
        now=now(),
    )
    if not patch:
        return None
    apply.patch_status(memo.api, plural="loraadapters", namespace=namespace, name=meta["name"], status=patch)
    return patch.get("phase")


async def adapter_changed(
    body: kopf.Body,
    namespace: str,
    spec: kopf.Spec,
    memo: kopf.Memo,
    model_servers_index: Any,
    adapters_index: Any,
    pods_index: Any,
    **_: Any,
) -> None:
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    key = (namespace, spec.get("modelServer", ""))
    servers = snapshot(model_servers_index, key)
    new_phase = await in_pool(
        memo, rollup_adapter, dict(body), memo=memo, server_exists=bool(servers), pods=snapshot(pods_index, key)
    )
    if new_phase:
        await recount(
            servers, key, memo=memo, adapters_index=adapters_index, new_phases={body["metadata"]["name"]: new_phase}
        )


async def recount(
    servers: list[Any], key: tuple[str, str], *, memo: kopf.Memo, adapters_index: Any, new_phases: Mapping[str, str]
) -> None:
    """Reconcile the servers whose adapters just changed phase, so their adapter counts follow at once (with the
    new phases already: see adapter_phases)."""
    if not new_phases:
        return
    memo.written_phases[key].update(new_phases)
    for server_body in servers:
        await reconcile_serially(server_body, memo=memo, adapters_index=adapters_index)


def rollup_server_adapters(
    namespace: str, *, adapters: list[Any], memo: kopf.Memo, server_exists: bool, pods: list[Any]
) -> dict[str, str]:
    """Re-judge every adapter of one server; the new phase of each whose phase changed."""
    new_phases = {}
    for entry in adapters:
        body = apply.get(memo.api, path=f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/loraadapters/{entry['name']}")
        if body is not None:
            phase = rollup_adapter(body, memo=memo, server_exists=server_exists, pods=pods)
            if phase:
                new_phases[entry["name"]] = phase
    return new_phases


async def pod_event(
    labels: kopf.Labels,
    namespace: str,
    memo: kopf.Memo,
    model_servers_index: Any,
    adapters_index: Any,
    pods_index: Any,
    **_: Any,
) -> None:
    """A server pod came, went, or changed readiness: re-judge its server's adapters (and prune gone pods)."""
    key = (namespace, labels.get(naming.LABEL_SERVER, ""))
    servers = snapshot(model_servers_index, key)
    new_phases = await in_pool(
        memo,
        rollup_server_adapters,
        namespace,
        adapters=snapshot(adapters_index, key),
        memo=memo,
        server_exists=bool(servers),
        pods=snapshot(pods_index, key),
    )
    await recount(servers, key, memo=memo, adapters_index=adapters_index, new_phases=new_phases)


# --- wiring ---------------------------------------------------------------------------------------------------------


def make_registry(settings: Settings) -> kopf.OperatorRegistry:
    """All handlers in a fresh registry (no import-time registration: tests and the local stack build their own)."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry)(configure)
    kopf.on.login(registry=registry)(login)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.index(*MODEL_SERVERS, registry=registry, id="model_servers_index")(model_servers_index)
    kopf.index(*LORA_ADAPTERS, registry=registry, id="adapters_index")(adapters_index)
    kopf.index("", "v1", "pods", labels=MANAGED, registry=registry, id="pods_index")(pods_index)

    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(*MODEL_SERVERS, registry=registry, id="reconcile")(model_server_changed)
    kopf.timer(*MODEL_SERVERS, interval=settings.resync_seconds, registry=registry, id="resync")(model_server_changed)
    kopf.on.event(*MODEL_SERVERS, registry=registry, id="server_event")(model_server_event)
    kopf.on.event("apps", "v1", "deployments", labels=MANAGED, registry=registry)(deployment_event)
    kopf.on.event(*LORA_ADAPTERS, registry=registry)(adapter_changed)
    # No timer on LoRAAdapters: a timer makes kopf put a finalizer on every adapter, and every change that matters
    # (agent status patches, pods, servers) already arrives as an event.
    kopf.on.event("", "v1", "pods", labels=MANAGED, registry=registry)(pod_event)
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
    bundle = pathlib.Path(settings.kernel_configs_dir) if settings.kernel_configs_dir else kernel_configs.bundle_root()
    memo = kopf.Memo(settings=settings, bundle=bundle)
    await kopf.operator(
        registry=registry or make_registry(settings),
        memo=memo,
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
