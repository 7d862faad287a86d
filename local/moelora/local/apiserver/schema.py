"""What a real API server checks on a custom object: the CRD's structural defaults, its JSON Schema, its CEL rules.

`schema_errors` says why in short (for tests of the CRDs); `refuse_invalid` answers as kube-apiserver does
(`crvalidation`'s field errors in an errors.NewInvalid Status), so clients such as kubectl print each field.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import kmock

from moelora.local.apiserver import crfields, crvalidation


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
    return list(_cel_errors(obj, schema, ""))


def refuse_invalid(
    obj: Mapping[str, Any], schema: Mapping[str, Any], *, group: str, kind: str, old: Mapping[str, Any] | None = None
) -> None:
    """Raise the 422 Invalid kube-apiserver answers for a custom object its CRD's schema or rules refuse: message
    `<Kind>.<group> "<name>" is invalid: <field>: <body>`, details naming the object and one cause per field error
    (apimachinery pkg/api/errors NewInvalid). `old`, on an update, ratchets unchanged nodes as the server does."""
    errors = crvalidation.validate(obj, schema, crfields.MISSING if old is None else old)
    if not errors:
        return
    name = (obj.get("metadata") or {}).get("name", "")
    raise kmock.KubernetesError(
        status=422,
        reason="Invalid",
        message=crfields.invalid_message(kind=kind, group=group, name=name, errors=errors),
        details=crfields.invalid_details(kind=kind, group=group, name=name, errors=errors),
    )


@functools.cache
def _cel_program(rule: str) -> Any:
    """A compiled CEL rule, compiled once per rule because cel-python's compiler is slow."""
    import celpy  # imported late: only validation needs it

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_errors(obj: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
    import celpy

    for rule in schema.get("x-kubernetes-validations") or []:
        program = _cel_program(rule["rule"])
        try:
            ok = program.evaluate({"self": celpy.json_to_cel(obj)})
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
