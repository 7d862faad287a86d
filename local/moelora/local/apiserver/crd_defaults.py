"""The API server's checks of each `default` in a CRD's schema, as apiextensions-apiserver makes them.

apiextensions-apiserver pkg/apiserver/schema/defaulting/validation.go (`validate`) walks the schema through
`properties` and `items` (never `additionalProperties`, where defaults are forbidden) and, at each node with a non-null
default: refuses one with fields the node would prune ("must not have unknown fields"); validates it against the
node's schema; and only if that passes evaluates the x-kubernetes-validations rules of the node and of the nodes
below it against the default AS WRITTEN (nested defaults are not filled in first), with the default as oldSelf too
and nothing ratcheted: the rules evaluated and worded by `celrules`, as for custom objects.
Not emulated: defaults inside embedded resources' metadata, and what `celrules` does not emulate.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema

from moelora.local.apiserver import crvalidation
from moelora.local.apiserver.celrules import cel_errors
from moelora.local.apiserver.fielderrors import FieldError, invalid, not_supported, required

_META_FIELDS = ("metadata", "apiVersion", "kind")


def default_errors(schema: Mapping[str, Any], path: str) -> list[FieldError]:
    """Every error of the defaults in the root `schema` at field path `path` (`...openAPIV3Schema`)."""
    return list(_walk(schema, path, root=True))


def _walk(node: Mapping[str, Any], path: str, *, root: bool) -> Iterator[FieldError]:
    if node.get("default") is not None:
        yield from _one_default(node["default"], node, f"{path}.default")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}.items", root=False)
    for key, sub in (node.get("properties") or {}).items():
        if root and key in _META_FIELDS:
            continue  # defaults there are refused by the schema checks ("must not be set in top-level ...")
        yield from _walk(sub, f"{path}.properties[{key}]", root=False)


def _one_default(default: Any, node: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    if crvalidation.prune(copy.deepcopy(default), node, root=False):
        yield invalid(path, default, "must not have unknown fields")
    schema_errors = list(_schema_errors(default, node, path))
    if schema_errors:
        yield from schema_errors
    else:
        yield from cel_errors(default, node, path, default, ratchet=False)


def _schema_errors(value: Any, node: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    """The default against its node's OpenAPI schema, worded as kubeOpenAPIResultToFieldErrors words kube-openapi's
    results (pkg/apiserver/validation/validation.go): Required and NotSupported exactly, the rest as Invalid with
    jsonschema's own explanation."""
    for error in sorted(jsonschema.Draft7Validator(node).iter_errors(value), key=lambda e: list(e.absolute_path)):
        where = path + "".join(f".{part}" for part in error.absolute_path)
        if error.validator == "required":
            missing = re.match(r"'(.*)' is a required property", error.message)
            yield required(f"{where}.{missing.group(1)}" if missing else where)
        elif error.validator == "enum":
            yield not_supported(where, error.instance, list(error.validator_value))
        else:
            yield invalid(where, error.instance, error.message)
