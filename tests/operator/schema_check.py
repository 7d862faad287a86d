"""A checker for the schema subset of published_schemas.py: every problem, each with the path where it is."""

from __future__ import annotations

import re
from typing import Any

_TYPES: dict[str, type | tuple[type, ...]] = {"object": dict, "array": list, "string": str, "integer": int}


def problems(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """What in `obj` breaks `schema`; empty when nothing does."""
    found: list[str] = []
    where = path or "<root>"
    expected = schema.get("type")
    if expected is not None and (not isinstance(obj, _TYPES[expected]) or isinstance(obj, bool)):
        return [f"{where}: expected {expected}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        found.append(f"{where}: {obj!r} is not one of {schema['enum']}")
    if isinstance(obj, str):
        if len(obj) < schema.get("minLength", 0):
            found.append(f"{where}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(obj) > schema["maxLength"]:
            found.append(f"{where}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], obj):
            found.append(f"{where}: {obj!r} does not match {schema['pattern']}")
    if isinstance(obj, int) and not isinstance(obj, bool):
        if "minimum" in schema and obj < schema["minimum"]:
            found.append(f"{where}: {obj} < {schema['minimum']}")
        if "maximum" in schema and obj > schema["maximum"]:
            found.append(f"{where}: {obj} > {schema['maximum']}")
    if isinstance(obj, list):
        if len(obj) < schema.get("minItems", 0):
            found.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(obj) > schema["maxItems"]:
            found.append(f"{where}: more than {schema['maxItems']} items")
        for index, item in enumerate(obj):
            found += problems(item, schema.get("items", {}), f"{path}[{index}]")
    if isinstance(obj, dict):
        for key in schema.get("required", []):
            if key not in obj:
                found.append(f"{where}: {key} is required")
        for key, value in obj.items():
            if key in schema.get("properties", {}):
                found += problems(value, schema["properties"][key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                found += problems(value, schema["additionalProperties"], f"{path}.{key}")
    return found
