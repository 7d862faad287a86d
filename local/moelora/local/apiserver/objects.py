"""Pure helpers on stored objects: merge-patch diffs, JSON paths, Secrets' stringData."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping
from typing import Any


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch turning `old` into `new` (nulls for removed keys)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = (
                merge_diff(old[key], value) if isinstance(value, dict) and isinstance(old[key], dict) else value
            )
    return patch


def at_path(obj: Any, path: str) -> Any:
    """The value at a JSON path like `.spec.replicas`, or None."""
    for key in [part for part in path.split(".") if part]:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    """Set the value at a JSON path like `.spec.replicas`, creating the dicts on the way."""
    *parents, last = [part for part in path.split(".") if part]
    for key in parents:
        obj = obj.setdefault(key, {})
    obj[last] = value


def fold_string_data(obj: dict[str, Any]) -> None:
    """A Secret's write-only `stringData` is merged into `data` (base64), as the real API server stores it."""
    if obj.get("kind") != "Secret" or not isinstance(obj.get("stringData"), dict):
        return
    encoded = {key: base64.b64encode(str(value).encode()).decode() for key, value in obj.pop("stringData").items()}
    obj["data"] = {**(obj.get("data") or {}), **encoded}


def now() -> str:
    """The current time as Kubernetes writes timestamps (UTC, whole seconds)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
