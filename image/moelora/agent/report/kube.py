"""The agent's only contact with Kubernetes: watch its server's LoRAAdapters, read Secrets, patch its status key.

The API server sends each agent only its own server's adapters (a field selector on spec.modelServer); of those,
events that change only status (the other pods' agents' patches) are dropped before any parsing.

Each agent writes only `status.replicas.<its pod>` (plus the facts read from the adapter's files) with a JSON merge
patch of the status subresource: N replicas patching the same object never overwrite each other.
"""

from __future__ import annotations

import base64
import datetime
import functools
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
from kubernetes.client.exceptions import ApiException

from moelora.agent.check.validate import AdapterInfo
from moelora.agent.reconcile import Desired
from moelora.api import GROUP, VERSION, ReplicaAdapterState, Rollup

logger = logging.getLogger(__name__)
PLURAL = "loraadapters"
EVENT_COMPONENT = "moelora-agent"


def api_client() -> kubernetes.client.ApiClient:
    """In a pod: the service account; elsewhere: KUBECONFIG (or ~/.kube/config)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config()
        return kubernetes.client.ApiClient()
    client: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(
        config_file=os.environ.get("KUBECONFIG") or None
    )
    return client


# Every request but the watch gets a deadline: a request the API server never answers must not stall the loop.
REQUEST_TIMEOUT = 30


class Kube:
    def __init__(self, *, client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.client = client
        self.custom = kubernetes.client.CustomObjectsApi(client)
        # The CRD declares spec.modelServer selectable (Kubernetes >= 1.31); an older server refuses the selector
        # with 400, and then this agent filters client-side instead (belongs()).
        self.field_selectors = True

    @functools.cached_property
    def core(self) -> kubernetes.client.CoreV1Api:
        """Built on first use (a Secret read, an Event): importing CoreV1Api builds ~150 pydantic models, 0.6-1.5 s
        on 2 cores, which an agent restart would otherwise pay before it serves /metrics or lists its adapters."""
        return kubernetes.client.CoreV1Api(self.client)

    def _selector(self, model_server: str | None) -> dict[str, Any]:
        if model_server is None or not self.field_selectors:
            return {}
        return {"field_selector": f"spec.modelServer={model_server}"}

    def list_adapters(self, *, model_server: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """The LoRAAdapters of the namespace (only `model_server`'s if given, where the API server can select them)
        and the list's resourceVersion (to watch from)."""
        try:
            body: dict[str, Any] = self.custom.list_namespaced_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, self.namespace, PLURAL, _request_timeout=REQUEST_TIMEOUT, **self._selector(model_server)
            )
        except ApiException as error:
            if error.status != 400 or not self._selector(model_server):
                raise
            logger.warning("the API server cannot select LoRAAdapters by spec.modelServer; watching all of them")
            self.field_selectors = False
            return self.list_adapters(model_server=model_server)
        return list(body.get("items", [])), (body.get("metadata") or {}).get("resourceVersion") or None

    def watch_adapters(
        self,
        *,
        resource_version: str | None,
        timeout_seconds: int,
        watch: kubernetes.watch.Watch,
        model_server: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) until the server ends the watch; ERROR events come through for the caller."""
        kwargs: dict[str, Any] = {"timeout_seconds": timeout_seconds, "_request_timeout": timeout_seconds + 30}
        kwargs.update(self._selector(model_server))
        if resource_version:
            kwargs["resource_version"] = resource_version
        events = watch.stream(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, **kwargs
        )
        for event in events:
            yield str(event["type"]), event["raw_object"]

    def read_secret(self, *, name: str) -> dict[str, str] | None:
        """The Secret's data decoded; None if it does not exist (or this pod may not read it)."""
        try:
            secret = self.core.read_namespaced_secret(name, self.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status in (403, 404):
                return None
            raise
        return {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}

    def patch_replica(self, *, name: str, pod: str, state: ReplicaAdapterState, info: AdapterInfo | None) -> bool:
        """Merge-patch this pod's key of the adapter's status (and the file facts, those known); False if the adapter
        is gone."""
        # Explicit nulls: a merge patch must delete a stale reason/lastError, not leave it.
        entry = state.model_dump(mode="json", by_alias=True)
        entry["observedAt"] = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # Stale until the operator rolls this change up: with the operator away, the phase shown says it is old.
        status: dict[str, Any] = {"replicas": {pod: entry}, "rollup": Rollup.STALE.value}
        if info is not None:
            status.update(rank=info.rank, baseModel=info.base_model, targetModules=list(info.target_modules))
            if info.size_bytes is not None:
                status["sizeBytes"] = info.size_bytes
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, name, {"status": status}, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def patch_on_demand_load(self, *, name: str, pod: str, load: float | None) -> bool:
        """Merge-patch this pod's key of the adapter's status.onDemandLoad (None deletes it); False if the adapter is
        gone."""
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                {"status": {"onDemandLoad": {pod: load}}},
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def create_pod_event(self, *, pod: str, pod_uid: str, reason: str, message: str, type: str = "Warning") -> None:
        """Record an Event on this agent's own Pod (what `kubectl describe pod` shows)."""
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": self.namespace}
        if pod_uid:
            involved["uid"] = pod_uid
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            # Our own unique name: generateName is not served by every API (nor by the local emulator).
            "metadata": {"name": f"{pod}.{secrets.token_hex(8)}", "namespace": self.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": pod,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        # The client sends any JSON-able body; its annotation names only its own model class.
        self.core.create_namespaced_event(self.namespace, body, _request_timeout=REQUEST_TIMEOUT)  # type: ignore[arg-type]


def belongs(obj: dict[str, Any], *, model_server: str, pod: str | None = None) -> bool:
    """Desired by this server: names it, and is not being deleted; with placement (`pod` given), also assigned to
    this pod by the operator (status.placement.replicas: the agent reads the assignment, never computes it)."""
    if (obj.get("spec") or {}).get("modelServer") != model_server or (obj.get("metadata") or {}).get(
        "deletionTimestamp"
    ):
        return False
    return pod is None or pod in (((obj.get("status") or {}).get("placement") or {}).get("replicas") or ())


class AdapterWatcher:
    """Keeps the adapters of one ModelServer current by list + watch, in a daemon thread: all of them (what a
    request may name, `server_adapters`) and, with placement, those assigned to this pod (`snapshot`).

    Any watch error (expired resourceVersion, dropped connection, API server restart) leads to a fresh list after
    a backoff, so the snapshot converges whatever happened in between. `on_change` runs after every change.
    """

    def __init__(
        self,
        *,
        kube: Kube,
        model_server: str,
        on_change: Callable[[], None],
        watch_timeout: int = 300,
        pod: str | None = None,  # with placement: only the adapters assigned to this pod are desired
    ) -> None:
        self.kube = kube
        self.model_server = model_server
        self.pod = pod
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.synced = threading.Event()
        self._objects: dict[str, Desired] = {}  # the server's, by name, parsed once per change (not once per loop)
        self._assigned: set[str] = set()  # with placement: the names assigned to this pod
        # By name: what the last parsed copy said that matters here (metadata.generation; with placement, whether
        # this pod is assigned it), so other pods' status patches are dropped unparsed.
        self._seen: dict[str, tuple[int | None, bool]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: kubernetes.watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name="adapter-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def snapshot(self) -> list[Desired]:
        """The adapters this pod should hold: with placement, those assigned to it; else all of the server's."""
        with self._lock:
            if self.pod is None:
                return list(self._objects.values())
            return [item for name, item in self._objects.items() if name in self._assigned]

    def server_adapters(self) -> list[Desired]:
        with self._lock:
            return list(self._objects.values())

    def _parse(self, obj: dict[str, Any]) -> Desired | None:
        if not belongs(obj, model_server=self.model_server):
            return None
        try:
            return Desired.from_object(obj)
        except (ValueError, KeyError) as error:  # the CRD validates; an object it let through is skipped
            logger.warning(
                "skipping LoRAAdapter %s: invalid spec: %s",
                obj.get("metadata", {}).get("name"),
                str(error).splitlines()[0],
            )
            return None

    def _key(self, obj: dict[str, Any]) -> tuple[int | None, bool]:
        assigned = self.pod is not None and belongs(obj, model_server=self.model_server, pod=self.pod)
        return obj["metadata"].get("generation"), assigned

    def _replace(self, items: list[dict[str, Any]]) -> None:
        parsed = [d for d in map(self._parse, items) if d is not None]
        self._seen = {item["metadata"]["name"]: self._key(item) for item in items}
        assigned = {name for name, (_, here) in self._seen.items() if here}
        with self._lock:
            self._objects = {d.name: d for d in parsed}
            self._assigned = assigned

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        key = self._key(obj)
        deleting = obj["metadata"].get("deletionTimestamp")
        if kind == "MODIFIED" and key[0] is not None and self._seen.get(name) == key and not deleting:
            return  # status patches (every pod's agent writes its own key) leave the generation as it was
        self._seen[name] = key
        if kind == "DELETED":
            self._seen.pop(name, None)
        desired = None if kind == "DELETED" else self._parse(obj)
        here = desired is not None and key[1]
        with self._lock:
            if (name in self._assigned) != here:
                self._assigned.symmetric_difference_update({name})
            elif desired is None and name not in self._objects:
                return
            elif desired is not None and self._objects.get(name) == desired:
                return  # a status-only change (our own patches): nothing to do
            if desired is None:
                self._objects.pop(name, None)
            else:
                self._objects[name] = desired
        self.on_change()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                items, version = self.kube.list_adapters(model_server=self.model_server)
                self._replace(items)
                self.synced.set()
                self.on_change()
                backoff = 0.5
                self._watch = kubernetes.watch.Watch()
                for kind, obj in self.kube.watch_adapters(
                    resource_version=version,
                    timeout_seconds=self.watch_timeout,
                    watch=self._watch,
                    model_server=self.model_server,
                ):
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":  # e.g. 410 Gone: our resourceVersion is too old
                        logger.info("adapter watch ended with an error event; listing again")
                        break
                    if kind == "BOOKMARK":
                        continue
                    self._apply(kind, obj)
            except Exception as error:  # noqa: BLE001 - any failure: list again after a pause
                if self._stop.is_set():
                    return
                logger.warning("adapter watch failed (%s); listing again in %.1fs", type(error).__name__, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
