"""What a real API server checks on a custom object: the CRD's structural defaults, its JSON Schema, its CEL rules."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema


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
