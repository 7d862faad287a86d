"""Built-in objects as a real API server stores them: decoded into Go structs and encoded again.

kube-apiserver decodes a built-in kind (a Deployment, a ConfigMap) into its Go type and serves the re-encoding, so
every struct field tagged `omitempty` whose value is empty disappears: Go's encoding/json omits "false, 0, a nil
pointer, a nil interface value, and any empty array, slice, map, or string" for such a field. Map entries are data,
not fields, and keep their "" values (labels, annotations, a ConfigMap's data, a nodeSelector).
The schemas tell the two apart: a node with `properties` is a struct, one with only `additionalProperties` a map.
`required` marks the fields encoded without `omitempty` (kube-openapi derives it from that tag and `+optional`).
Only strings, lists, maps and nulls are dropped: the schemas do not say whether a number or a boolean is a pointer
(kept when 0/false) or a plain value (dropped), so those stay. Custom objects are stored as sent (after the CRD's
pruning and defaults), so they never pass through here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from moelora.local.apiserver.openapi import builtin_schemas

_REF = "#/components/schemas/"
_GVK = "x-kubernetes-group-version-kind"


@functools.cache
def _kinds() -> dict[tuple[str, str, str], str]:
    """(group, version, kind) -> the name of the built-in schema of that kind."""
    result: dict[tuple[str, str, str], str] = {}
    for name, schema in builtin_schemas().items():
        tags = schema.get(_GVK) or []
        if len(tags) == 1:  # DeleteOptions, WatchEvent & co. carry one tag per group: not a stored kind
            result[(tags[0]["group"], tags[0]["version"], tags[0]["kind"])] = name
    return result


def builtin_schema(*, group: str, version: str, kind: str | None) -> Mapping[str, Any] | None:
    """The schema of a built-in kind, or None for custom kinds and unknown ones."""
    name = _kinds().get((group, version, kind or ""))
    return builtin_schemas()[name] if name else None


def _resolve(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """A schema with its $ref (or allOf of one $ref) followed."""
    schemas = builtin_schemas()
    while True:
        ref = schema.get("$ref") or next((s.get("$ref") for s in schema.get("allOf") or [] if "$ref" in s), None)
        if not ref:
            return schema
        schema = schemas.get(ref.removeprefix(_REF), {})


def _omitted(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether an `omitempty` field of this schema and value disappears in Go's encoding."""
    if value is None:
        return schema.get("format") != "date-time"  # metav1.Time encodes its zero value as null
    if value == "":
        # IntOrString is a struct, which omitempty never omits; untyped fields (apiextensions JSON) are pointers.
        return schema.get("type") == "string" and schema.get("format") not in ("int-or-string", "date-time")
    if value == []:
        return schema.get("type") == "array"
    if value == {}:
        return "additionalProperties" in schema and "properties" not in schema  # an empty map; an empty struct stays
    return False


def _encode(value: Any, schema: Mapping[str, Any]) -> Any:
    schema = _resolve(schema)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value  # RawExtension, JSON: bytes kept as sent
    if isinstance(value, dict):
        properties = schema.get("properties")
        if isinstance(properties, Mapping):  # a struct
            required = set(schema.get("required") or ())
            result = {}
            for key, item in value.items():
                sub = properties.get(key)
                if sub is None:
                    result[key] = item
                    continue
                sub = _resolve(sub)
                if key not in required and _omitted(item, sub):
                    continue
                result[key] = _encode(item, sub)
            return result
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):  # a map: every entry kept, structs inside it encoded
            return {key: _encode(item, extra) for key, item in value.items()}
        return value
    if isinstance(value, list) and isinstance(items := schema.get("items"), Mapping):
        return [_encode(item, items) for item in value]
    return value


def store_as_encoded(obj: dict[str, Any], *, group: str, version: str, kind: str | None) -> None:
    """Rewrite a built-in object in place as the API server encodes the Go struct it decodes it into; custom and
    unknown kinds are left as they are."""
    schema = builtin_schema(group=group, version=version, kind=kind)
    if schema is not None:
        encoded = _encode(obj, schema)
        obj.clear()
        obj.update(encoded)
