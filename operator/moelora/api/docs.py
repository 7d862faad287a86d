"""A Markdown reference of the CRDs, generated from the same schemas as the CRDs themselves.

`python -m moelora.api.docs > docs/crd-reference.md` (`make docs`); a test keeps the file current.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from moelora.api.crd import custom_resource_definitions

_CONSTRAINTS = (
    ("enum", "one of {}"),
    ("minimum", ">= {}"),
    ("maximum", "<= {}"),
    ("minLength", "length >= {}"),
    ("maxLength", "length <= {}"),
    ("maxItems", "at most {} items"),
    ("pattern", "matches `{}`"),
)


def _type_of(node: dict[str, Any]) -> str:
    kind = node.get("type", "any")
    if kind == "array":
        return f"[]{_type_of(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type_of(node['additionalProperties'])}"
    return str(kind)


def _rows(node: dict[str, Any], path: str, required: bool) -> Iterator[str]:
    notes = [
        template.format(", ".join(map(str, node[key])) if key == "enum" else node[key])
        for key, template in _CONSTRAINTS
        if key in node
    ]
    notes += [f"rule: {rule['message']}" for rule in node.get("x-kubernetes-validations", [])]
    default = f"`{node['default']}`" if "default" in node else ""
    description = " ".join(node.get("description", "").split()).replace("|", "\\|")
    detail = "; ".join(notes).replace("|", "\\|")
    yield f"| `{path}` | {_type_of(node)} | {'yes' if required else ''} | {default} | {description} | {detail} |"
    children = node.get("properties", {})
    if node.get("type") == "array":
        children = node.get("items", {}).get("properties", {})
        path += "[]"
    wanted = set(node.get("items", node).get("required", []))
    for key, child in children.items():
        yield from _rows(child, f"{path}.{key}", key in wanted)


def render() -> str:
    lines = [
        "# CRD reference",
        "",
        "Generated from the pydantic models by `python -m moelora.api.docs`. Do not edit.",
        "",
    ]
    for crd in custom_resource_definitions():
        names = crd["spec"]["names"]
        version = crd["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        lines += [
            (f"## {names['kind']} ({crd['spec']['group']}/{version['name']}, short name `{names['shortNames'][0]}`)"),
            "",
            schema.get("description", ""),
            "",
        ]
        for top in ("spec", "status"):
            lines += [
                f"### {top}",
                "",
                "| field | type | required | default | description | constraints |",
                "|---|---|---|---|---|---|",
            ]
            for key, child in schema["properties"][top].get("properties", {}).items():
                lines += _rows(child, f"{top}.{key}", key in schema["properties"][top].get("required", []))
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
