"""Pure helpers on stored objects: merge-patch diffs, JSON paths, Secrets' stringData, label and field selectors."""

from __future__ import annotations

import base64
import datetime
import re
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


class Selector:
    """labelSelector (=, ==, !=, in, notin, exists, !exists) and fieldSelector (metadata.name/namespace)."""

    def __init__(self, labels: list[tuple[str, str, set[str]]], fields: dict[str, str]) -> None:
        self.labels, self.fields = labels, fields

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Selector:
        labels = []
        for term in re.split(r",(?![^()]*\))", params.get("labelSelector") or ""):
            term = term.strip()
            if not term:
                continue
            if match := re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", term):
                labels.append((match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}))
            elif "!=" in term:
                key, value = term.split("!=", 1)
                labels.append((key.strip(), "!=", {value.strip()}))
            elif "=" in term:
                key, value = re.split("==?", term, maxsplit=1)
                labels.append((key.strip(), "=", {value.strip()}))
            elif term.startswith("!"):
                labels.append((term[1:].strip(), "!exists", set()))
            else:
                labels.append((term, "exists", set()))
        fields = {}
        for term in (params.get("fieldSelector") or "").split(","):
            if "=" in term:
                key, value = re.split("==?", term, maxsplit=1)
                fields[key.strip()] = value.strip()
        return cls(labels, fields)

    def matches(self, meta: Mapping[str, Any]) -> bool:
        for key, value in self.fields.items():
            if key in ("metadata.name", "metadata.namespace") and meta.get(key.split(".", 1)[1]) != value:
                return False
        have = meta.get("labels") or {}
        for key, op, values in self.labels:
            present = key in have
            if op in ("=", "in") and (not present or have[key] not in values):
                return False
            if op in ("!=", "notin") and present and have[key] in values:
                return False
            if op == "exists" and not present or op == "!exists" and present:
                return False
        return True
