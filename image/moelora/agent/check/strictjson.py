"""JSON from untrusted bytes, parsed strictly and with bounded nesting; every failure is an AdapterError.

Used for adapter_config.json, safetensors headers and the base model's config.json. Callers bound the size before
parsing.
"""

from __future__ import annotations

import json
from typing import Any

from moelora.agent.errors import AdapterError, quote
from moelora.api import FailureReason


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {quote(key)}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def load_json(text: bytes, *, what: str, max_depth: int, reason: FailureReason) -> Any:
    """Strict JSON (UTF-8, no duplicate keys, no NaN/Infinity) nested at most `max_depth` deep, or AdapterError.

    The C parser raises RecursionError on deep nesting and ValueError on integers of thousands of digits; both, like
    every other parse failure, become the caller's reason.
    """
    try:
        value = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        problem = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise AdapterError(reason, f"{what} is not valid JSON: {quote(problem)}") from None
    if _depth(value) > max_depth:
        raise AdapterError(reason, f"{what} is nested more than {max_depth} levels deep")
    return value
