"""What a real API server refuses in a CustomResourceDefinition's schemas, with its field paths and messages.

apiextensions-apiserver validates each schema (pkg/apis/apiextensions/validation/validation.go,
validateCustomResourceDefinitionValidation) in this order: the structural-schema invariants
(pkg/apiserver/schema/validation.go, ValidateStructural, errors sorted); only if there are none, every default
(`crd_defaults`); then the OpenAPI-schema rules (ValidateCustomResourceDefinitionOpenAPISchema). A v1 CRD whose
versions share one schema is validated once, at `spec.validation.openAPIV3Schema` (the internal type's field:
pkg/apis/apiextensions/v1/conversion.go moves identical per-version schemas there), otherwise each at
`spec.versions[i].schema.openAPIV3Schema`. The same checks run on create, update and their dry runs.
Not emulated: the rest of the CRD (names, versions, conversion, printer columns, metadata.name), structural
completeness (properties named only under anyOf/allOf), the root-field restriction with the status subresource,
CEL compilation and cost checks, and the relaxations an update gets when the stored CRD already broke a rule.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import kmock

from moelora.local.apiserver import fielderrors
from moelora.local.apiserver.crd_defaults import default_errors
from moelora.local.apiserver.fielderrors import FieldError, forbidden, invalid, not_supported, required

RESOURCE = kmock.resource("apiextensions.k8s.io/v1/customresourcedefinitions")

_ROOT, _ITEMS, _FIELD = "root", "items", "field"
_OPENAPI_TYPES = ("array", "boolean", "integer", "number", "object", "string")  # openapiV3Types, listed sorted
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def check(crd: Mapping[str, Any]) -> None:
    """Raise the API server's 422 Invalid if it would refuse `crd` (an apiextensions.k8s.io/v1 object)."""
    if errors := definition_errors(crd):
        name = (crd.get("metadata") or {}).get("name", "")
        raise fielderrors.invalid_error(
            group="apiextensions.k8s.io", kind="CustomResourceDefinition", name=name, errors=errors
        )


def definition_errors(crd: Mapping[str, Any]) -> list[FieldError]:
    """The errors of `crd`'s schemas, in the server's order; [] when it accepts them."""
    versions = [version for version in (crd.get("spec") or {}).get("versions") or [] if isinstance(version, dict)]
    schemas = [version.get("schema") for version in versions]
    if schemas and schemas[0] is not None and all(schema == schemas[0] for schema in schemas):
        return _validation_errors(schemas[0], "spec.validation")
    errors: list[FieldError] = []
    for index, schema in enumerate(schemas):
        if schema is not None:
            errors += _validation_errors(schema, f"spec.versions[{index}].schema")
    return errors


def _validation_errors(validation: Mapping[str, Any], path: str) -> list[FieldError]:
    schema = validation.get("openAPIV3Schema")
    if not isinstance(schema, dict):
        return []
    path = f"{path}.openAPIV3Schema"
    errors: list[FieldError] = []
    if schema.get("nullable"):
        errors.append(forbidden(f"{path}.nullable", "nullable cannot be true at the root"))
    structural = sorted(_structural(schema, _ROOT, path), key=str)
    errors += structural or default_errors(schema, path)
    errors += _openapi(schema, path, root=True, meta_default="")
    return errors


# -- ValidateStructural (pkg/apiserver/schema/validation.go, validateStructuralInvariants) -----------------------------


def _structural(node: Mapping[str, Any], level: str, path: str) -> Iterator[FieldError]:
    kind = node.get("type") or ""
    if kind == "array" and "items" not in node:
        yield required(f"{path}.items", "must be specified")
    if isinstance(node.get("items"), dict):
        yield from _structural(node["items"], _ITEMS, f"{path}.items")
    properties = node.get("properties") or {}
    for key, sub in properties.items():
        yield from _structural(sub, _FIELD, f"{path}.properties[{key}]")
    if "additionalProperties" in node:  # validateGeneric
        if level == _ROOT:
            yield forbidden(f"{path}.additionalProperties", "must not be used at the root")
        if isinstance(node["additionalProperties"], dict):
            yield from _structural(node["additionalProperties"], _FIELD, f"{path}.additionalProperties")
    int_or_string = bool(node.get("x-kubernetes-int-or-string"))
    preserve = bool(node.get("x-kubernetes-preserve-unknown-fields"))
    embedded = bool(node.get("x-kubernetes-embedded-resource"))
    if int_or_string and preserve:  # validateExtensions
        yield invalid(
            f"{path}.x-kubernetes-preserve-unknown-fields", True, "must be false if x-kubernetes-int-or-string is true"
        )
    if int_or_string and embedded:
        yield invalid(
            f"{path}.x-kubernetes-embedded-resource", True, "must be false if x-kubernetes-int-or-string is true"
        )
    yield from _value_validation(node, path)
    if embedded and kind != "object":
        detail = "must be object if x-kubernetes-embedded-resource is true"
        yield invalid(f"{path}.type", kind, detail) if kind else required(f"{path}.type", detail)
    elif not kind and not int_or_string and not preserve:
        yield required(f"{path}.type", _EMPTY_TYPE[level])
    if embedded and "additionalProperties" in node:
        yield forbidden(f"{path}.additionalProperties", "must not be used if x-kubernetes-embedded-resource is set")
    if level == _ROOT and kind and kind != "object":
        yield invalid(f"{path}.type", kind, "must be object at the root")
    if level == _ROOT or embedded:
        for key, wanted in (("kind", "string"), ("apiVersion", "string"), ("metadata", "object")):
            if key in properties and (properties[key].get("type") or "") != wanted:
                yield invalid(f"{path}.properties[{key}].type", properties[key].get("type") or "", f"must be {wanted}")
    if level == _ROOT and "metadata" in properties and _restricts_metadata(properties["metadata"]):
        yield forbidden(
            f"{path}.properties[metadata]",
            "must not specify anything other than name and generateName, but metadata is implicitly specified",
        )
    if embedded and not preserve and not properties:
        yield required(
            f"{path}.properties",
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        )


_EMPTY_TYPE = {
    _ROOT: "must not be empty at the root",
    _ITEMS: "must not be empty for specified array items",
    _FIELD: "must not be empty for specified object fields",
}

# What the structural form of a schema drops before comparing (it has no field for them), and what metadata may say.
_NOT_STRUCTURAL = {"example", "externalDocs", "id", "$schema"}


def _restricts_metadata(node: Mapping[str, Any]) -> bool:
    """Whether a root metadata schema says more than its type, its default and a schema of name/generateName."""
    rest = {key: value for key, value in node.items() if key not in _NOT_STRUCTURAL | {"type", "default"}}
    if set(rest.get("properties") or {}) in ({"name"}, {"generateName"}, {"name", "generateName"}):
        del rest["properties"]
    return any(value not in (False, "", None) for value in rest.values())


# validateNestedValueValidation: what a schema under anyOf/allOf/oneOf/not may not say.
_NESTED_FORBIDDEN = (
    ("type", "must be empty to be structural"),
    ("additionalProperties", "must be undefined to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
)


def _value_validation(node: Mapping[str, Any], path: str, *, skip_any_of: bool | None = None) -> Iterator[FieldError]:
    """validateValueValidation, with the two int-or-string exceptions (anyOf, or allOf[0].anyOf, of integer|string)."""
    if skip_any_of is None:
        skip_any_of = node.get("anyOf") == _INT_OR_STRING
    all_of = node.get("allOf") or []
    if not skip_any_of:
        for index, sub in enumerate(node.get("anyOf") or []):
            yield from _nested(sub, f"{path}.anyOf[{index}]", skip_any_of=False)
    for index, sub in enumerate(all_of):
        skip = index == 0 and isinstance(sub, dict) and sub.get("anyOf") == _INT_OR_STRING
        yield from _nested(sub, f"{path}.allOf[{index}]", skip_any_of=skip)
    for index, sub in enumerate(node.get("oneOf") or []):
        yield from _nested(sub, f"{path}.oneOf[{index}]", skip_any_of=False)
    if isinstance(node.get("not"), dict):
        yield from _nested(node["not"], f"{path}.not", skip_any_of=False)


def _nested(node: Any, path: str, *, skip_any_of: bool) -> Iterator[FieldError]:
    if not isinstance(node, dict):
        return
    yield from _value_validation(node, path, skip_any_of=skip_any_of)
    if isinstance(node.get("items"), dict):
        yield from _nested(node["items"], f"{path}.items", skip_any_of=False)
    for key, sub in (node.get("properties") or {}).items():
        yield from _nested(sub, f"{path}.properties[{key}]", skip_any_of=False)
    for key, detail in _NESTED_FORBIDDEN:
        if node.get(key) not in (None, False, "", []):
            yield forbidden(f"{path}.{key}", detail)
    if "metadata" in (node.get("properties") or {}):
        yield forbidden(f"{path}.properties[metadata]", "must not be specified in a nested context")


# -- ValidateCustomResourceDefinitionOpenAPISchema (pkg/apis/apiextensions/validation/validation.go) -------------------


def _openapi(node: Any, path: str, *, root: bool, meta_default: str) -> Iterator[FieldError]:
    """The schema rules of one node and, recursively, of its subschemas; `meta_default` names the top-level meta
    field a node is inside of (defaults are forbidden there), else ''."""
    if not isinstance(node, dict):
        return
    yield from _standard(node, path, meta_default)
    if node.get("uniqueItems"):
        yield forbidden(
            f"{path}.uniqueItems", "uniqueItems cannot be set to true since the runtime complexity becomes quadratic"
        )
    properties = node.get("properties") or {}
    if "additionalProperties" in node:
        extra = node["additionalProperties"]
        if properties and extra is not True:
            yield forbidden(f"{path}.additionalProperties", "additionalProperties and properties are mutual exclusive")
        yield from _openapi(extra, f"{path}.additionalProperties", root=False, meta_default=meta_default)
    for key, sub in properties.items():
        inside = key if root and key in ("metadata", "kind", "apiVersion") else meta_default
        yield from _openapi(sub, f"{path}.properties[{key}]", root=False, meta_default=inside)
    yield from _openapi(node.get("not"), f"{path}.not", root=False, meta_default=meta_default)
    for junctor in ("allOf", "oneOf", "anyOf"):
        for index, sub in enumerate(node.get(junctor) or []):
            yield from _openapi(sub, f"{path}.{junctor}[{index}]", root=False, meta_default=meta_default)
    yield from _openapi(node.get("items"), f"{path}.items", root=False, meta_default=meta_default)
    yield from _extensions(node, path)


def _standard(node: Mapping[str, Any], path: str, meta_default: str) -> Iterator[FieldError]:
    """specStandardValidatorV3.validate."""
    kind = node.get("type") or ""
    if kind and kind not in _OPENAPI_TYPES:
        yield not_supported(f"{path}.type", kind, _OPENAPI_TYPES)
    if node.get("default") is not None and meta_default:
        yield forbidden(f"{path}.default", f"must not be set in top-level {meta_default}")
    for key in ("id", "additionalItems", "patternProperties", "definitions", "dependencies", "$ref"):
        if node.get(key):
            yield forbidden(f"{path}.{key}", f"{key} is not supported")
    if kind == "null":
        yield forbidden(f"{path}.type", "type cannot be set to null, use nullable as an alternative")
    if isinstance(node.get("items"), list):
        yield forbidden(f"{path}.items", "items must be a schema object and not an array")


def _extensions(node: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    """The x-kubernetes-* rules at the end of ValidateCustomResourceDefinitionOpenAPISchema."""
    kind = node.get("type") or ""
    if node.get("x-kubernetes-preserve-unknown-fields") is False:
        yield invalid(f"{path}.x-kubernetes-preserve-unknown-fields", False, "must be true or undefined")
    list_type = node.get("x-kubernetes-list-type")
    keys = node.get("x-kubernetes-list-map-keys") or []
    if list_type is not None and kind != "array":
        detail = "must be array if x-kubernetes-list-type is specified"
        yield invalid(f"{path}.type", kind, detail) if kind else required(f"{path}.type", detail)
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        yield not_supported(f"{path}.x-kubernetes-list-type", list_type, ["atomic", "set", "map"])
    if keys and list_type is None:
        yield required(f"{path}.x-kubernetes-list-type", "must be map if x-kubernetes-list-map-keys is non-empty")
    elif keys and list_type != "map":
        yield invalid(
            f"{path}.x-kubernetes-list-type", list_type, "must be map if x-kubernetes-list-map-keys is non-empty"
        )
    if list_type == "map" and not keys:
        yield required(f"{path}.x-kubernetes-list-map-keys", "must not be empty if x-kubernetes-list-type is map")
    for index, rule in enumerate(node.get("x-kubernetes-validations") or []):
        where = f"{path}.x-kubernetes-validations[{index}]"
        text, message = (rule.get("rule") or "").strip(), rule.get("message") or ""
        if not text:
            yield required(f"{where}.rule", "rule is not specified")
        elif message and not message.strip():
            yield invalid(f"{where}.message", message, "message must be non-empty if specified")
        elif "\n" in message.strip() or "\r" in message.strip():
            yield invalid(f"{where}.message", message, "message must not contain line breaks")
        elif ("\n" in text or "\r" in text) and not message.strip():
            yield required(f"{where}.message", "message must be specified if rule contains line breaks")
        reason = rule.get("reason")
        if reason is not None and reason not in _RULE_REASONS:
            yield not_supported(f"{where}.reason", reason, _RULE_REASONS)


# supportedValidationReason, as sets.String.List() gives it: sorted.
_RULE_REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
