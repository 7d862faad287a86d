"""What kube-apiserver does to a custom object before it stores it, for a CRD loaded as published: prune unknown
fields, drop nulls and fill defaults, then validate against the OpenAPI v3 schema and (`celrules`) every CEL rule,
answering 422 Invalid with the server's field errors (`fielderrors`).

Sources, all in kubernetes/kubernetes' apiextensions-apiserver: pkg/apiserver/schema (pruning; defaulting: nulls of
non-nullable fields are dropped before defaults, a default is filled wherever a field is absent and defaulting goes
on inside it), pkg/apiserver/validation/validation.go (kubeOpenAPIResultToFieldErrors: which field error each
OpenAPI failure becomes; the go-openapi messages "<path> in body should ..."), pkg/registry/customresource/
strategy.go (CEL rules are skipped after a "blocking" schema error: Required, Unsupported, Too long, Too many or a
wrong type, with a field-less error saying so).
Update ratcheting (CRDValidationRatcheting, GA in 1.33) in its simplest form: a node equal to the old object's
correlated node (same property, map key, or list-map key) is not validated again.
Not emulated: metadata.name validation, formats besides date-time, ratcheting of list items without keys.
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Iterator, Mapping
from typing import Any

from moelora.local.apiserver.celrules import MISSING, cel_errors, list_key, old_item
from moelora.local.apiserver.fielderrors import (
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    TYPE_INVALID,
    UNSUPPORTED,
    FieldError,
    child,
    duplicate,
    invalid,
    not_supported,
    required,
    too_long,
    too_many,
    type_invalid,
)

# The field errors that stop the CEL rules from running (pkg/registry/customresource/strategy.go), and what says so.
BLOCKING = {REQUIRED, UNSUPPORTED, TOO_LONG, TOO_MANY, TYPE_INVALID}
UNCHECKED = (
    "some validation rules were not checked because the object was invalid; correct the existing errors to complete "
    "validation"
)

# --- pruning, nulls, defaults ------------------------------------------------------------------------------------


def prune(obj: Any, schema: Mapping[str, Any], path: str = "", *, root: bool = True) -> list[str]:
    """Drop the fields the schema does not declare, in place; the paths dropped. apiVersion, kind and metadata of
    the object (and of embedded resources) are always kept."""
    dropped: list[str] = []
    if isinstance(obj, dict):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        keep = {"apiVersion", "kind", "metadata"} if root or schema.get("x-kubernetes-embedded-resource") else set()
        for key in list(obj):
            if key == "metadata" and key in keep:
                continue  # ObjectMeta, which the server checks apart from the schema
            if key in properties:
                dropped += prune(obj[key], properties[key], child(path, key), root=False)
            elif isinstance(extra, dict):
                dropped += prune(obj[key], extra, f"{path}[{key}]", root=False)
            elif key not in keep and not schema.get("x-kubernetes-preserve-unknown-fields") and extra is not True:
                del obj[key]
                dropped.append(child(path, key))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            dropped += prune(item, schema["items"], f"{path}[{index}]", root=False)
    return dropped


def default(obj: Any, schema: Mapping[str, Any]) -> Any:
    """Drop nulls the schema does not allow, then fill defaults where a field is absent, recursively, in place."""
    if isinstance(obj, dict):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, sub in properties.items():
            if key in obj and obj[key] is None and not sub.get("nullable"):
                del obj[key]
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                default(obj[key], sub)
        if isinstance(extra, dict):
            for key in [k for k in obj if k not in properties]:
                default(obj[key], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            default(item, schema["items"])
    return obj


# --- the OpenAPI schema ------------------------------------------------------------------------------------------

_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(value), "null")


def _type_ok(value: Any, schema: Mapping[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    expected = schema.get("type")
    if not expected:
        return True
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _JSON_TYPES[expected])


def schema_errors(value: Any, schema: Mapping[str, Any], path: str = "", old: Any = MISSING) -> Iterator[FieldError]:
    """The OpenAPI v3 schema's errors at `value`, as kubeOpenAPIResultToFieldErrors words them."""
    if old is not MISSING and old == value:
        return  # ratcheting: an unchanged node stays as it was accepted
    name = path or "<nil>"
    if value is None:
        if not schema.get("nullable") and schema.get("type"):
            yield type_invalid(path, "null", f'{name} in body must be of type {schema["type"]}: "null"')
        return
    if not _type_ok(value, schema):
        expected = "integer,string" if schema.get("x-kubernetes-int-or-string") else schema["type"]
        actual = _type_name(value)
        yield type_invalid(path, actual, f'{name} in body must be of type {expected}: "{actual}"')
        return
    if "enum" in schema and value not in schema["enum"]:
        yield not_supported(path, value, schema["enum"])
    if isinstance(value, str):
        yield from _string_errors(value, schema, path)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield from _number_errors(value, schema, path)
    elif isinstance(value, list):
        yield from _list_errors(value, schema, path, old)
    elif isinstance(value, dict):
        yield from _object_errors(value, schema, path, old)
    for sub in schema.get("allOf") or []:
        yield from schema_errors(value, sub, path)
    for keyword in ("anyOf", "oneOf"):
        if branches := schema.get(keyword):
            passing = sum(1 for sub in branches if next(iter(schema_errors(value, sub, path)), None) is None)
            if passing == 0 or (keyword == "oneOf" and passing > 1):
                how = "at least one schema" if keyword == "anyOf" else "one and only one schema"
                yield invalid(path, value, f"{name} in body must validate {how} ({keyword})")


def _string_errors(value: str, schema: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    name = path or "<nil>"
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        yield too_long(path, schema["maxLength"])
    if "minLength" in schema and len(value) < schema["minLength"]:
        yield invalid(path, value, f"{name} in body should be at least {schema['minLength']} chars long")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        yield invalid(path, value, f"{name} in body should match '{schema['pattern']}'")
    if schema.get("format") == "date-time":
        try:
            datetime.datetime.fromisoformat(value)
        except ValueError:
            yield type_invalid(path, value, f'{name} in body must be of type date-time: "{value}"')


def _number_errors(value: float, schema: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    name = path or "<nil>"
    if "minimum" in schema:
        low, exclusive = schema["minimum"], schema.get("exclusiveMinimum")
        if value < low or (exclusive and value == low):
            how = "greater than" if exclusive else "greater than or equal to"
            yield invalid(path, value, f"{name} in body should be {how} {low}")
    if "maximum" in schema:
        high, exclusive = schema["maximum"], schema.get("exclusiveMaximum")
        if value > high or (exclusive and value == high):
            how = "less than" if exclusive else "less than or equal to"
            yield invalid(path, value, f"{name} in body should be {how} {high}")
    if (step := schema.get("multipleOf")) and value % step:
        yield invalid(path, value, f"{name} in body should be a multiple of {step}")


def _list_errors(value: list[Any], schema: Mapping[str, Any], path: str, old: Any) -> Iterator[FieldError]:
    name = path or "<nil>"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        yield too_many(path, len(value), schema["maxItems"])
    if "minItems" in schema and len(value) < schema["minItems"]:
        yield invalid(path, len(value), f"{name} in body should have at least {schema['minItems']} items")
    list_type, keys = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys") or []
    if list_type in ("set", "map") or schema.get("uniqueItems"):
        seen: list[Any] = []
        for index, item in enumerate(value):
            key = list_key(item, keys) if list_type == "map" else item
            if key in seen:
                yield duplicate(f"{path}[{index}]", key)
            seen.append(key)
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            yield from schema_errors(item, items, f"{path}[{index}]", old_item(old, item, schema))


def _object_errors(value: dict[str, Any], schema: Mapping[str, Any], path: str, old: Any) -> Iterator[FieldError]:
    name = path or "<nil>"
    for key in schema.get("required") or []:
        if key not in value:
            yield required(child(path, key))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        yield too_many(path, len(value), schema["maxProperties"])
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        count = schema["minProperties"]
        yield invalid(path, len(value), f"{name} in body should have at least {count} properties")
    properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
    old_map = old if isinstance(old, dict) else {}
    for key, item in value.items():
        if key in properties:
            yield from schema_errors(item, properties[key], child(path, key), old_map.get(key, MISSING))
        elif isinstance(extra, dict):
            yield from schema_errors(item, extra, f"{path}[{key}]", old_map.get(key, MISSING))


# --- the whole admission -----------------------------------------------------------------------------------------


def validate(obj: Mapping[str, Any], schema: Mapping[str, Any], old: Any = MISSING) -> list[FieldError]:
    """Every error of a pruned, defaulted object: the schema's, then (unless one of those blocks them) the rules'."""
    errors = list(schema_errors(obj, schema, "", old))
    if any(error.type in BLOCKING for error in errors):
        return [*errors, invalid("", None, UNCHECKED)]
    return [*errors, *cel_errors(obj, schema, "", old)]


def admit(obj: dict[str, Any], schema: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
    """Prune, default and validate `obj` in place, as the server does on create (or update, given the stored
    `old`); the errors that refuse it."""
    prune(obj, schema)
    default(obj, schema)
    return validate(obj, schema, MISSING if old is None else old)
