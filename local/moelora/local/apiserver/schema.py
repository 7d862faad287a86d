"""What a real API server checks on a custom object: the CRD's structural defaults, its JSON Schema, its CEL rules.

`schema_errors` says why in short (for tests of the CRDs); `refuse_invalid` answers as kube-apiserver does
(`crvalidation`'s field errors in an errors.NewInvalid Status), so clients such as kubectl print each field. Both
evaluate the CEL rules through `celrules`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonschema

from moelora.local.apiserver import celrules, crvalidation, fielderrors


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


def schema_errors(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Why a custom object is invalid against an openAPIV3Schema: JSON Schema errors, then CEL rules. [] if valid."""
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{error.json_path.replace('$', '', 1) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
    ]
    if errors:
        return errors  # CEL rules assume a schema-valid object, as the API server does
    return [
        f"{'.' + e.field if e.field else '<root>'}: {e.detail or e.body()}" for e in celrules.cel_errors(obj, schema)
    ]


def refuse_invalid(
    obj: Mapping[str, Any], schema: Mapping[str, Any], *, group: str, kind: str, old: Mapping[str, Any] | None = None
) -> None:
    """Raise the 422 Invalid kube-apiserver answers for a custom object its CRD's schema or rules refuse: message
    `<Kind>.<group> "<name>" is invalid: <field>: <body>`, details naming the object and one cause per field error
    (apimachinery pkg/api/errors NewInvalid). `old`, on an update, ratchets unchanged nodes as the server does."""
    errors = crvalidation.validate(obj, schema, celrules.MISSING if old is None else old)
    if errors:
        name = (obj.get("metadata") or {}).get("name", "")
        raise fielderrors.invalid_error(kind=kind, group=group, name=name, errors=errors)
