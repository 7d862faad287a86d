"""OpenAPI v3 as a real API server publishes it, and the strict field validation kubectl relies on it for.

`/openapi/v3` lists one document per group-version; each (`/openapi/v3/apis/<group>/<version>`, `/openapi/v3/api/v1`)
has `components.schemas` (tagged with `x-kubernetes-group-version-kind`, what `kubectl explain` reads) and a PATCH
operation per resource declaring the `fieldValidation` parameter: kubectl then leaves validation to the server
(`fieldValidation=Strict` on create and patch), which refuses unknown fields with 400 BadRequest.
Our CRDs' schemas are their openAPIV3Schema; built-in kinds' come from the upstream JSON schemas that
kubernetes-validate ships (the newest version it has), turned back into OpenAPI 3.0's shape.
Not emulated: fieldValidation=Warn's warnings, and the pruning of a custom object's unknown fields (Ignore and Warn
keep them); /openapi/v2 (client-side apply of a built-in kind asks for it, and on 404 uses kubectl's own types).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.resources.abc import Traversable
from typing import Any

import aiohttp.web
import kmock

from moelora.api.crd import custom_resource_definitions

_REF = "#/components/schemas/"
_GVK = "x-kubernetes-group-version-kind"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


@functools.cache
def _schema_dir() -> Traversable:
    """kubernetes-validate's newest non-strict schema folder (vX.Y.Z-local), from its package data."""
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    folders = [p for p in root.iterdir() if re.fullmatch(r"v\d+\.\d+\.\d+-local", p.name)]
    return max(folders, key=lambda p: tuple(int(n) for n in p.name[1:].removesuffix("-local").split(".")))


def _to_openapi(schema: Any) -> Any:
    """A JSON Schema (2020-12, as kubernetes-validate writes it) in OpenAPI 3.0's shape, as the API server serves it."""
    if isinstance(schema, list):
        return [_to_openapi(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: _to_openapi(value) for key, value in schema.items() if key not in ("$schema", "$id")}
    if isinstance(types := result.get("type"), list):  # ["string", "null"]: nullability is not OpenAPI 3.0's way
        real = [t for t in types if t != "null"]
        result["type"] = real[0] if real else "object"
    if options := result.get("oneOf"):
        types = {option.get("type") for option in options if isinstance(option, dict)}
        if len(types) == len(options) and None not in types:  # IntOrString, Quantity: served as strings
            del result["oneOf"]
            result["type"] = "string"
            if types == {"string", "integer"}:
                result["format"] = "int-or-string"
                result["x-kubernetes-int-or-string"] = True
    if isinstance(ref := result.pop("$ref", None), str):
        target = {"$ref": _REF + ref.rsplit("/", 1)[-1]}
        return {"allOf": [target], **result} if result else target
    return result


@functools.cache
def builtin_schemas() -> dict[str, dict[str, Any]]:
    """Every upstream definition (name -> schema) in OpenAPI 3.0's shape."""
    raw = json.loads((_schema_dir() / "_definitions.json").read_text())
    return {name: _to_openapi(schema) for name, schema in raw["$defs"].items()}


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        if isinstance(ref := schema.get("$ref"), str):
            yield ref.removeprefix(_REF)
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item)


def _closure(schemas: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The named schemas and every schema they reference, transitively."""
    result: dict[str, Any] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in result or name not in schemas:
            continue
        result[name] = schemas[name]
        todo.extend(_refs(schemas[name]))
    return result


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(group, version) -> {schema name: schema} for our CRDs, with metadata as the standard ObjectMeta."""
    result: dict[tuple[str, str], dict[str, Any]] = {}
    for crd in custom_resource_definitions():
        spec = crd["spec"]
        prefix = ".".join(reversed(spec["group"].split(".")))
        for version in spec["versions"]:
            kind = spec["names"]["kind"]
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            meta = schema.setdefault("properties", {}).get("metadata") or {}
            schema["properties"]["metadata"] = {
                "allOf": [{"$ref": _REF + _OBJECT_META}],
                "description": meta.get("description", "Standard object's metadata."),
            }
            gvk = {"group": spec["group"], "version": version["name"], "kind": kind}
            schema["x-kubernetes-group-version-kind"] = [gvk]
            item_list = {
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"allOf": [{"$ref": _REF + "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"}]},
                    "items": {"type": "array", "items": {"$ref": f"{_REF}{prefix}.{version['name']}.{kind}"}},
                },
                "x-kubernetes-group-version-kind": [{**gvk, "kind": spec["names"]["listKind"]}],
            }
            group = result.setdefault((spec["group"], version["name"]), {})
            group[f"{prefix}.{version['name']}.{kind}"] = schema
            group[f"{prefix}.{version['name']}.{spec['names']['listKind']}"] = item_list
    return result


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


class OpenAPI:
    """The OpenAPI v3 documents for the resources `resources()` yields ((resource, kmock.ResourceInfo) pairs)."""

    def __init__(self, *, resources: Callable[[], Iterable[tuple[Any, kmock.ResourceInfo]]]) -> None:
        self._resources = resources
        self._crds = _crd_schemas()

    @functools.cached_property
    def _hash(self) -> str:
        """Changes whenever a document would: the CRDs and the upstream schemas' version."""
        seed = json.dumps([_schema_dir().name, sorted(self._crds, key=str), custom_resource_definitions()])
        return hashlib.sha512(seed.encode()).hexdigest().upper()

    def _kinds(self) -> dict[tuple[str, str], list[tuple[Any, kmock.ResourceInfo]]]:
        """(group, version) -> its resources (those with a kind)."""
        result: dict[tuple[str, str], list[tuple[Any, kmock.ResourceInfo]]] = {}
        for resource, info in self._resources():
            if info.kind and resource.plural:
                result.setdefault((resource.group, resource.version), []).append((resource, info))
        return result

    def discovery(self) -> dict[str, Any]:
        """`/openapi/v3`: where each group-version's document is."""
        return {
            "paths": {
                _gv_path(*gv): {"serverRelativeURL": f"/openapi/v3/{_gv_path(*gv)}?hash={self._hash}"}
                for gv in sorted(self._kinds())
            }
        }

    @functools.cache  # noqa: B019 - one OpenAPI per emulator, documents never change while it runs
    def document(self, group: str, version: str) -> dict[str, Any] | None:
        """`/openapi/v3/apis/<group>/<version>`, or None if no resource of it is served.

        A kind with no schema (kopf's peerings) gets one that takes any field, as kopf's own CRDs declare.
        """
        resources = self._kinds().get((group, version))
        if not resources:
            return None
        builtins = builtin_schemas()
        own = dict(self._crds.get((group, version), {}))
        tagged = [
            name
            for name, schema in builtins.items()
            if any(
                (g["group"], g["version"]) == (group, version)
                for g in schema.get("x-kubernetes-group-version-kind") or []
            )
        ]
        declared = {(g["kind"]) for name in tagged + list(own) for g in (builtins.get(name) or own[name])[_GVK]}
        for _, info in resources:
            if info.kind not in declared:
                own[".".join([*reversed(group.split(".")), version, info.kind])] = {
                    "type": "object",
                    "properties": {"metadata": {"allOf": [{"$ref": _REF + _OBJECT_META}]}},
                    "x-kubernetes-preserve-unknown-fields": True,
                    _GVK: [{"group": group, "version": version, "kind": info.kind}],
                }
        schemas = {**_closure(builtins, tagged), **own}
        schemas.update(_closure(builtins, [ref for schema in own.values() for ref in _refs(schema)]))
        paths = {}
        for resource, info in resources:
            namespaced = "namespaces/{namespace}/" if info.namespaced else ""
            gvk = {"group": group, "version": version, "kind": info.kind}
            operation = {
                "description": f"partially update the specified {info.kind}",
                "operationId": f"patch{info.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                ],
                "responses": {"200": {"description": "OK"}},
            }
            paths[f"/{_gv_path(group, version)}/{namespaced}{resource.plural}/{{name}}"] = {"patch": operation}
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": _schema_dir().name.removesuffix("-local")},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    def respond(self, path: str) -> aiohttp.web.Response:
        """The answer to a GET of an /openapi/v3 path (/openapi/v2 is not served: kubectl needs only v3)."""
        if path.rstrip("/") == "/openapi/v3":
            return aiohttp.web.json_response(self.discovery())
        match = re.fullmatch(r"/openapi/v3/(?:apis/([^/]+)/([^/]+)|api/([^/]+))/?", path)
        document = match and self.document(match[1] or "", match[2] or match[3])
        if not document:
            return aiohttp.web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "reason": "NotFound",
                    "message": "the server could not find the requested resource",
                    "code": 404,
                },
                status=404,
            )
        return aiohttp.web.json_response(document, headers={"Cache-Control": "public, immutable"})

    def check_strict(self, request: Any, kind: str | None) -> None:
        """With `fieldValidation=Strict`, refuse a create or patch body with undeclared fields, as the server does.

        Raises kmock.KubernetesError 400 BadRequest naming each unknown field.
        """
        resource = request.resource
        if request.params.get("fieldValidation") != "Strict" or not kind or not isinstance(request.data, dict):
            return
        if request.subresource not in (None, "status"):
            return
        unknown = self.unknown_fields(request.data, group=resource.group, version=resource.version, kind=kind)
        if unknown:
            fields = ", ".join(f'unknown field "{field}"' for field in unknown)
            raise kmock.KubernetesError(
                status=400,
                reason="BadRequest",
                message=f'{kind} in version "{resource.version}" cannot be handled as a {kind}: '
                f"strict decoding error: {fields}",
            )

    def schema_of(self, group: str, version: str, kind: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(the kind's schema, all schemas it may reference) or None if unknown."""
        document = self.document(group, version)
        if document is None:
            return None
        schemas = document["components"]["schemas"]
        for schema in schemas.values():
            if {"group": group, "version": version, "kind": kind} in schema.get("x-kubernetes-group-version-kind", []):
                return schema, schemas
        return None

    def unknown_fields(self, obj: Any, *, group: str, version: str, kind: str) -> list[str]:
        """The paths of fields the kind's schema does not declare ("spec.foo", "spec.items[0].bar")."""
        found = self.schema_of(group, version, kind)
        if found is None:
            return []
        schema, schemas = found
        return list(_unknown(obj, schema, schemas, ""))


def _resolve(schema: Mapping[str, Any], schemas: Mapping[str, Any]) -> Mapping[str, Any]:
    """A schema with its $ref (or single allOf $ref) followed, its own keys kept."""
    while True:
        ref = schema.get("$ref") or next((s.get("$ref") for s in schema.get("allOf") or [] if "$ref" in s), None)
        if not ref:
            return schema
        rest = {k: v for k, v in schema.items() if k not in ("$ref", "allOf")}
        schema = {**schemas.get(ref.removeprefix(_REF), {}), **rest}


def _unknown(value: Any, schema: Mapping[str, Any], schemas: Mapping[str, Any], path: str) -> Iterator[str]:
    schema = _resolve(schema, schemas)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        properties, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            if key.startswith("$"):  # strategic-merge-patch directives
                continue
            if properties is not None and key in properties:
                yield from _unknown(item, properties[key], schemas, f"{path}{key}.")
            elif isinstance(extra, dict):
                yield from _unknown(item, extra, schemas, f"{path}{key}.")
            elif properties is not None and extra is not True:
                yield f"{path}{key}"
    elif isinstance(value, list) and isinstance(items := schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _unknown(item, items, schemas, f"{path.removesuffix('.')}[{index}].")
