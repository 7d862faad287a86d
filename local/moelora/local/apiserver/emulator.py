"""kmock's Kubernetes emulator with what kopf and kubectl need of a real API server.

What `Emulator` adds to kmock 0.8:
- metadata a server fills: uid, resourceVersion (bumped on every write), generation (bumped on spec changes),
  creationTimestamp, and a name from generateName (kopf posts Events that way);
- the status subresource: a write to `/status` changes only status, a write to the object never changes it;
- our CRDs' openAPIV3Schema: defaults applied, invalid objects refused with 422 Invalid (`schema`);
- CustomResourceDefinitions refused as the server refuses their schemas, with its messages (`crd_rules`);
- other projects' kinds once a test or the stack declares them (`serve_published`), admitted as their published CRDs
  say: pruning, defaults, schema and every CEL rule, 422 Invalid in the server's words (`upstream`);
- server-side dry runs: a create, patch or delete is checked and answered, never stored (`dryrun`);
- built-in objects stored as the server re-encodes them, empty `omitempty` fields dropped (`encoding`);
- garbage collection, emulated: an object whose ownerReferences all name absent owners is deleted, when an owner
  goes and soon after the object itself is created or updated naming only absent owners (`garbage`);
- watches that resume from a resourceVersion (`watchlog`), 410 Expired when too old, watch-list initial events
  ending in a bookmark (kubectl >= 1.35 waits that way), label and field selectors on lists and watches (`selectors`);
- kubectl compatibility: `kind`/`apiVersion` on lists, "v1" as the core group's version, JSON content type on
  watch streams, NotFound/AlreadyExists as error reasons, no short names on subresources;
- the scale subresource of our ModelServer (autoscaling/v1 Scale on /scale: `kubectl scale`, HPAs);
- kubectl get's server-side printing: Tables with our CRDs' printer columns (`tables`, `printers`); OpenAPI v3 for
  kubectl explain and for strict field validation, unknown fields refused with 400 BadRequest (`openapi`);
- speed: object and discovery requests skip kmock's reaction matching (`dispatch`), which slows as requests pile up.
Still missing (do not lean on it): resourceVersion conflicts (optimistic locking), PUT, strategic-merge list merging
(lists are replaced), server-side apply field ownership, admission/defaulting of built-in kinds, the Namespace
resource, any controller (Deployments get no ReplicaSets or pods; moelora.local.kubelet plays that part).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import secrets
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import dicts as kmock_dicts
from kmock._internal import enums as kmock_enums
from kmock._internal import rendering as kmock_rendering

from moelora.api.crd import custom_resource_definitions
from moelora.local.apiserver import crd_rules, dryrun, selectors, upstream
from moelora.local.apiserver.crds import crd_resources
from moelora.local.apiserver.dispatch import FastDispatch
from moelora.local.apiserver.encoding import store_as_encoded
from moelora.local.apiserver.garbage import Collector
from moelora.local.apiserver.objects import at_path, fold_string_data, merge_diff, now, set_path
from moelora.local.apiserver.openapi import OpenAPI
from moelora.local.apiserver.schema import apply_defaults, refuse_invalid
from moelora.local.apiserver.tables import Tables
from moelora.local.apiserver.watchlog import Expired, RecordingBuses, WatchLog


def _expired(message: str) -> dict[str, Any]:
    """The watch event telling a client to relist."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired"}
    return {"type": "ERROR", "object": {**status, "code": 410, "message": message}}


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator, FastDispatch):
    """kmock's emulator with server-filled metadata, status subresource, schema checks, GC and kubectl fixes."""

    validate: bool = True
    _tables: Tables = attrs.field(init=False)
    _openapi: OpenAPI = attrs.field(init=False)
    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _schemas: dict[Any, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _published: dict[Any, upstream.ServedVersion] = attrs.field(factory=dict, init=False)
    _watchlog: WatchLog = attrs.field(init=False)
    _scales: dict[Any, dict[str, str]] = attrs.field(factory=dict, init=False)
    _selectable: dict[Any, frozenset[str]] = attrs.field(
        factory=lambda: selectors.selectable_fields(kmock.resource), init=False
    )
    _collector: Collector = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._watchlog = WatchLog(versions=self._versions)
        self._buses = RecordingBuses(self._watchlog)  # type: ignore[assignment]
        self._collector = Collector(
            objects=self.objects, resources=self.resources, buses=self._buses, versions=self._versions, lock=self._lock
        )
        self._tables = Tables(kind_of=self._kind)
        self._openapi = OpenAPI(resources=lambda: [(r, self.resources[r]) for r in self._get_resources()])
        self.resources.load_bundled()
        for key, (info, schema) in crd_resources().items():
            self.resources[key] = info
            self._schemas[kmock.resource(key)] = schema
        for crd in custom_resource_definitions():
            for version in crd["spec"]["versions"]:
                if "scale" in version.get("subresources", {}):
                    key = f"{crd['spec']['group']}/{version['name']}/{crd['spec']['names']['plural']}"
                    self._scales[kmock.resource(key)] = version["subresources"]["scale"]
        # kopf's peering kinds, for operators run with a peering name (several replicas, one active).
        verbs = {"create", "delete", "get", "list", "patch", "watch"}
        self.resources["kopf.dev/v1/clusterkopfpeerings"] = kmock.ResourceInfo(
            namespaced=False, kind="ClusterKopfPeering", singular="clusterkopfpeering", verbs=verbs
        )
        self.resources["kopf.dev/v1/kopfpeerings"] = kmock.ResourceInfo(
            namespaced=True, kind="KopfPeering", singular="kopfpeering", verbs=verbs
        )

    def serve_published(self, *kinds: str) -> None:
        """Serve these kinds (upstream.PUBLISHED's names) as a cluster with their published CRDs installed does."""
        for served in (version for kind in kinds for version in upstream.served_versions(upstream.PUBLISHED[kind])):
            self.resources[served.key] = served.info
            self._published[kmock.resource(served.key)] = served

    # -- writes -----------------------------------------------------------------------------------------------------
    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        try:
            return self.resources[resource]
        except KeyError:
            return None

    def _kind(self, resource: Any) -> str | None:
        return (self._info(resource) or kmock.ResourceInfo()).kind

    def _current(self, request: kmock_rendering.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _check(self, resource: Any, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        if resource == crd_rules.RESOURCE and self.validate:
            crd_rules.check(obj)
        if resource in self._published and self.validate:
            self._published[resource].admit(obj, old)
        schema = self._schemas.get(resource)
        if schema is None or not self.validate:
            return
        apply_defaults(obj, schema)
        refuse_invalid(obj, schema, group=resource.group, kind=self._kind(resource) or "", old=old)

    def _encode(self, resource: Any, obj: dict[str, Any]) -> None:
        """A built-in object as the server stores it (`encoding`); custom objects stay as sent."""
        if resource not in self._schemas:
            store_as_encoded(obj, group=resource.group, version=resource.version, kind=self._kind(resource))

    def _prepare_create(self, request: kmock_rendering.Request) -> None:
        self._openapi.check_strict(request, self._kind(request.resource))
        obj = request.data
        if not isinstance(obj, dict):
            return
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if (
            request.namespace
            and not meta.get("namespace")
            and (self._info(request.resource) or kmock.ResourceInfo()).namespaced is not False
        ):
            meta["namespace"] = request.namespace
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta["generation"] = 1
        meta["creationTimestamp"] = now()
        meta.pop("deletionTimestamp", None)
        info = self._info(request.resource)
        if info is not None and "status" in info.subresources:
            obj.pop("status", None)  # a create never sets the status of a kind with a status subresource
        fold_string_data(obj)
        self._encode(request.resource, obj)
        self._check(request.resource, obj)

    def _prepare_update(self, request: kmock_rendering.Request) -> None:
        self._openapi.check_strict(request, self._kind(request.resource))
        old = self._current(request)
        if old is None or request.data is None:
            return  # kmock answers 404
        try:
            new = copy.deepcopy(kmock_dicts.patch_dict(old, request.data))
        except jsonpatch.JsonPatchException as exc:  # e.g. kopf's `test` of resourceVersion: it expects 422, not 500
            raise kmock.KubernetesError(status=422, reason="Invalid", message=f"the JSON patch failed: {exc}") from None
        info = self._info(request.resource)
        if request.subresource == "scale" and request.resource in self._scales:
            replicas = at_path(new, "spec.replicas")  # a Scale patch: {"spec": {"replicas": N}}
            new = copy.deepcopy(old)
            set_path(new, self._scales[request.resource]["specReplicasPath"], replicas)
        elif info is not None and "status" in info.subresources:
            if request.subresource == "status":  # its own metadata: a shared one would hide the version bump below
                new = {**old, "metadata": dict(old.get("metadata") or {}), "status": new.get("status")}
                if new["status"] is None:
                    del new["status"]
            else:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = old["status"]
        meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "generation", "namespace", "name"):  # immutable
            if key in old.get("metadata", {}):
                meta[key] = old["metadata"][key]
        if request.subresource != "status":
            fold_string_data(new)
            self._check(request.resource, new, old)
        self._encode(request.resource, new)
        body_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }
        if body_changed:
            meta["generation"] = int(old.get("metadata", {}).get("generation") or 1) + 1
        meta["resourceVersion"] = str(next(self._versions))
        object.__setattr__(request, "data", merge_diff(old, new))

    async def _handle(self, request: kmock_rendering.Request) -> aiohttp.web.StreamResponse:
        if request.url.path.startswith("/openapi/"):
            return self._openapi.respond(request.url.path)
        if request.resource is not None:
            try:
                async with self._lock:
                    if request.action == kmock_enums.action.CREATE:
                        self._prepare_create(request)
                    elif request.action == kmock_enums.action.UPDATE and request.name is not None:
                        self._prepare_update(request)
                    if dryrun.requested(request):  # checked like the write itself, then answered unstored
                        return dryrun.answer(request, objects=self.objects)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        # A DELETE, or a PATCH that drops the last finalizer, can remove an object: collect its dependents then.
        may_delete = request.name is not None and request.action in (
            kmock_enums.action.DELETE,
            kmock_enums.action.UPDATE,
        )
        before = self._current(request) if may_delete else None
        response = await super()._handle(request)
        if before is not None and self._current(request) is None:
            await self._collector.collect({before.get("metadata", {}).get("uid")})
        # As on a real cluster, a write naming only absent owners succeeds and the object goes soon after: the GC
        # checks an owner it has not seen by a live lookup (graph_builder.go addDependentToOwners, attemptToDelete).
        if request.resource is None:
            pass
        elif request.action == kmock_enums.action.CREATE and isinstance(request.data, dict):
            meta = request.data.get("metadata") or {}
            self._collector.written((request.resource, request.namespace or meta.get("namespace"), meta.get("name")))
        elif request.action == kmock_enums.action.UPDATE and request.name is not None:
            self._collector.written((request.resource, request.namespace, request.name))
        return response

    # -- lists and watches with resourceVersion semantics -----------------------------------------------------------
    def _matching(self, request: kmock_rendering.Request) -> Any:
        selectable = self._selectable.get(request.resource) or selectors.BUILTIN_FIELDS.get(request.resource.plural, ())
        try:  # a selector a real server refuses is a 400
            return selectors.request_filter(request, selectable=selectable)
        except selectors.SelectorError as exc:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from None

    async def _serve_list(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        info = self._info(request.resource)
        if info is None and request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        matches = self._matching(request)
        async with self._lock:
            items = [
                copy.deepcopy(obj.raw)
                for (resource, _, _), obj in self.objects.items()
                if not obj.deleted and matches(resource, obj.raw)
            ]
            version = next(self._versions)
            self._watchlog.mark(version)
        resource = request.resource
        listed = {
            "kind": f"{info.kind}List" if info and info.kind else "List",
            "apiVersion": resource.version if not resource.group else f"{resource.group}/{resource.version}",
            "metadata": {"resourceVersion": str(version)},
            "items": items,
        }
        return self._tables.convert(request, listed)

    def _serve_watch(self, request: kmock_rendering.Request) -> Any:  # type: ignore[override]
        self._matching(request)  # a malformed selector is refused before the stream starts
        # kubectl refuses a watch stream without a JSON content type.
        events = self._tables.stream(request, self._watch(request))
        return kmock_rendering.Response(headers={"Content-Type": "application/json"}, payload=events)

    async def _watch(self, request: kmock_rendering.Request) -> Any:
        yield b""  # send the headers now: clients wait for them before they consider the watch started
        params = request.params
        since = params.get("resourceVersion") or ""
        initial_events = params.get("sendInitialEvents") == "true" or since in ("", "0")
        timeout = float(params.get("timeoutSeconds") or 0)
        deadline = asyncio.get_running_loop().time() + timeout if timeout > 0 else None
        matches = self._matching(request)
        initial: list[dict[str, Any]] = []
        async with self._lock:
            current = [o.raw for (r, _, _), o in self.objects.items() if not o.deleted and matches(r, o.raw)]
            selected = {selectors.selection_key(request.resource, raw) for raw in current}
            if initial_events:
                initial = copy.deepcopy(current)
                position: int | None = self._watchlog.end
                version = next(self._versions)
            else:
                position = self._watchlog.position_after(int(since)) if since.isdigit() else None
                version = 0
        if position is None:
            yield _expired(f"too old resource version: {since}")
            return
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        if params.get("sendInitialEvents") == "true" and params.get("allowWatchBookmarks") == "true":
            info = self._info(request.resource)
            resource = request.resource
            yield {
                "type": "BOOKMARK",
                "object": {
                    "kind": info.kind if info else "",
                    "apiVersion": resource.group and f"{resource.group}/{resource.version}" or resource.version,
                    "metadata": {"resourceVersion": str(version), "annotations": {"k8s.io/initial-events-end": "true"}},
                },
            }
        try:
            async for resource, event in self._watchlog.follow(position, deadline=deadline):
                seen = selectors.selected_event(
                    resource, event, selected=matches(resource, event["object"]), passing=selected
                )
                if seen is not None:
                    yield seen
        except Expired as exc:
            yield _expired(str(exc))

    # -- reads and kubectl compatibility ----------------------------------------------------------------------------
    def _as_scale(self, request: kmock_rendering.Request, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The autoscaling/v1 Scale view of an object (what /scale serves)."""
        paths = self._scales[request.resource]
        meta = obj.get("metadata") or {}
        status = {"replicas": at_path(obj, paths["statusReplicasPath"]) or 0}
        if selector := at_path(obj, paths.get("labelSelectorPath", "")):
            status["selector"] = selector
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": at_path(obj, paths["specReplicasPath"]) or 0},
            "status": status,
        }

    async def _serve_fetch(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        obj = await super()._serve_fetch(request)
        if request.subresource == "scale" and request.resource in self._scales:
            return self._as_scale(request, obj)  # type: ignore[arg-type]
        return self._tables.convert(request, obj)

    async def _serve_update(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        obj = await super()._serve_update(request)
        if request.subresource == "scale" and request.resource in self._scales:
            return self._as_scale(request, obj)  # type: ignore[arg-type]
        return obj

    async def _serve_version(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        result = dict(await super()._serve_version(request))  # type: ignore[arg-type]
        result["groupVersion"] = str(result["groupVersion"]).lstrip("/")  # the core group is "v1", not "/v1"
        for entry in result.get("resources") or []:
            if "/" in entry["name"]:  # subresources have no short names (kubectl warns of ambiguity otherwise)
                entry["shortNames"], entry["categories"] = [], []
        return result

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if (
            isinstance(exc, kmock.KubernetesError)
            and not isinstance(exc, kmock.KubernetesNotFoundError)
            and exc.status == 409
        ):
            exc = kmock.KubernetesError(status=409, reason="AlreadyExists", message=exc.message)
        elif isinstance(exc, kmock.KubernetesNotFoundError):
            exc = kmock.KubernetesError(status=404, reason="NotFound", message=exc.message)
        return await super()._render_error(exc)
