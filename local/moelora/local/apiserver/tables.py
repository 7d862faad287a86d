"""Server-side printing: the `meta.k8s.io/v1` Table a client gets when it asks for one (kubectl get does).

kubectl asks with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...` and prints the Table's columns as they
come. Our CRDs' columns are their additionalPrinterColumns (JSONPath on each object, cells typed as declared, dates as
ages) after a Name column; built-in kinds get the columns kubectl shows for them, Name and Age for the others.
Each row carries the object as `includeObject` asks: PartialObjectMetadata (the default), the Object, or None.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import kmock

from moelora.api.crd import custom_resource_definitions
from moelora.local.apiserver.printers import BUILTIN_COLUMNS, NAME_AGE, Column, age

_TABLE = re.compile(r"as=Table;.*g=meta\.k8s\.io|g=meta\.k8s\.io;.*as=Table")


def table_version(headers: Mapping[str, str]) -> str | None:
    """The meta.k8s.io version of Table the Accept header asks for first (v1 or v1beta1), or None for plain JSON."""
    accept = next((value for key, value in headers.items() if key.lower() == "accept"), "")  # kmock keeps the case
    for choice in accept.split(","):
        if _TABLE.search(choice):
            params = dict(part.strip().split("=", 1) for part in choice.split(";")[1:] if "=" in part)
            return params.get("v", "v1")
    return None


@functools.cache
def _steps(path: str) -> tuple[tuple[str, Any], ...]:
    """A JSONPath like `.status.conditions[?(@.type=="Ready")].reason` as (kind, argument) steps."""
    pattern = re.compile(
        r"\.(?P<field>[\w$-]+)|\['(?P<quoted>[^']+)'\]|\[(?P<index>-?\d+|\*)\]"
        r"|\[\?\(@(?P<path>(?:\.[\w-]+)+)\s*(?P<op>==|!=)\s*(?P<value>\"[^\"]*\"|'[^']*'|[^)\s]+)\)\]"
    )
    path = path.strip().removeprefix("{").removesuffix("}").strip()
    steps: list[tuple[str, Any]] = []
    position = 0
    while position < len(path):
        match = pattern.match(path, position)
        if match is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {position}")
        if match["field"] or match["quoted"]:
            steps.append(("field", match["field"] or match["quoted"]))
        elif match["index"]:
            steps.append(("index", match["index"]))
        else:
            value = match["value"].strip("\"'")
            steps.append(("filter", (match["path"], match["op"], value)))
        position = match.end()
    return tuple(steps)


def _text(value: Any) -> str:
    """A scalar as JSONPath filters compare it (booleans as true/false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Every value a JSONPath (the subset printer columns use: fields, indexes, [*], ==/!= filters) finds."""
    values = [obj]
    for kind, argument in _steps(path):
        found: list[Any] = []
        for value in values:
            if kind == "field" and isinstance(value, Mapping) and argument in value:
                found.append(value[argument])
            elif kind == "index" and isinstance(value, list):
                if argument == "*":
                    found.extend(value)
                elif -len(value) <= int(argument) < len(value):
                    found.append(value[int(argument)])
            elif kind == "filter" and isinstance(value, list):
                sub, op, expected = argument
                for item in value:
                    got = jsonpath(item, sub)
                    equal = bool(got) and _text(got[0]) == expected
                    if equal == (op == "=="):
                        found.append(item)
        values = found
    return values


def _cell(column_type: str, value: Any) -> Any:
    """A value as a cell of a column of this type, or None (kubectl prints <none>) when it does not fit the type."""
    if value is None:
        return None
    if column_type == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if column_type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if column_type == "boolean" and isinstance(value, bool):
        return value
    if column_type == "string" and isinstance(value, str):
        return value
    if column_type == "date" and isinstance(value, str):
        return age(value)
    return None


def _printer_column(spec: Mapping[str, Any]) -> Column:
    """A CRD's additionalPrinterColumn as a Column."""
    path, column_type = spec["jsonPath"], spec["type"]

    def cell(obj: Mapping[str, Any], _now: datetime.datetime) -> Any:
        found = jsonpath(obj, path)
        return _cell(column_type, found[0]) if found else None

    return Column(
        name=spec["name"],
        type=column_type,
        format=spec.get("format", ""),
        description=spec.get("description") or f"Custom resource definition column (in JSONPath format): {path}",
        priority=int(spec.get("priority", 0)),
        cell=cell,
    )


def crd_columns() -> dict[Any, list[Column]]:
    """resource -> columns for our CRDs: Name, then the printer columns (an Age date column when there are none)."""
    result = {}
    for crd in custom_resource_definitions():
        spec = crd["spec"]
        for version in spec["versions"]:
            key = kmock.resource(f"{spec['group']}/{version['name']}/{spec['names']['plural']}")
            printers = version.get("additionalPrinterColumns")
            default = [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
            result[key] = [NAME_AGE[0], *map(_printer_column, printers or default)]
    return result


def _row_object(obj: Mapping[str, Any], include: str, version: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return dict(obj)
    return {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{version}", "metadata": obj.get("metadata")}


class Tables:
    """Renders lists, objects and watch events as Tables for the resources' columns."""

    def __init__(self, *, kind_of: Callable[[Any], str | None]) -> None:
        self._kind_of = kind_of  # resource -> its kind, or None if unknown
        self._crds = crd_columns()

    def columns(self, resource: Any) -> list[Column]:
        if resource in self._crds:
            return self._crds[resource]
        return BUILTIN_COLUMNS.get((resource.group, self._kind_of(resource)), NAME_AGE)

    def table(
        self,
        request: Any,
        objects: list[Mapping[str, Any]],
        *,
        resource_version: str,
        version: str,
        with_columns: bool = True,
    ) -> dict[str, Any]:
        """The Table of these objects; column definitions left out on watch events after the first."""
        columns = self.columns(request.resource)
        include = request.params.get("includeObject") or "Metadata"
        now = datetime.datetime.now(tz=datetime.UTC)
        rows = []
        for obj in objects:
            row: dict[str, Any] = {"cells": [column.cell(obj, now) for column in columns]}
            if (embedded := _row_object(obj, include, version)) is not None:
                row["object"] = embedded
            rows.append(row)
        return {
            "kind": "Table",
            "apiVersion": f"meta.k8s.io/{version}",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": [column.definition() for column in columns] if with_columns else [],
            "rows": rows,
        }

    def convert(self, request: Any, payload: Any) -> Any:
        """A list or object payload as a Table if the request asks for one; other payloads unchanged."""
        version = table_version(request.headers)
        if version is None or request.subresource or not isinstance(payload, dict):
            return payload
        if "items" in payload:
            objects, resource_version = payload["items"], payload.get("metadata", {}).get("resourceVersion", "")
        else:
            objects, resource_version = [payload], payload.get("metadata", {}).get("resourceVersion", "")
        return self.table(request, objects, resource_version=resource_version, version=version)

    async def stream(self, request: Any, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Watch events with each object as a one-row Table when asked; ERROR and BOOKMARK events pass unchanged."""
        version = table_version(request.headers)
        first = True
        async for event in events:
            if version is None or not isinstance(event, dict) or event.get("type") in ("ERROR", "BOOKMARK"):
                yield event
                continue
            obj = event["object"]
            resource_version = (obj.get("metadata") or {}).get("resourceVersion", "")
            table = self.table(request, [obj], resource_version=resource_version, version=version, with_columns=first)
            first = False
            yield {"type": event["type"], "object": table}
