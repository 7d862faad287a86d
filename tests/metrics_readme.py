"""The metrics tables of docs/reference.md as the contract of each process's /metrics: the parser and the
comparison that the agent's and the operator's metrics tests share."""

from __future__ import annotations

import pathlib
from typing import Any

REFERENCE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "reference.md"
SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def readme_metrics(subsection: str) -> dict[str, tuple[str, frozenset[str]]]:
    """{name: (type, label names)} from the table under `### <subsection>` of the reference's Metrics section."""
    section = REFERENCE.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    part = section.split(f"\n### {subsection}\n", 1)[1].split("\n### ", 1)[0]
    table = {}
    for row in (line for line in part.splitlines() if line.startswith("| `")):
        name, kind, labels = (cell.strip() for cell in row.strip("|").split("|")[:3])
        table[name.strip("`")] = (kind, frozenset(label.strip() for label in labels.split(",") if label.strip()))
    return table


def exposed_metrics(families: list[Any]) -> dict[str, tuple[str, frozenset[str]]]:
    """{name as queried: (type, label names)} of parsed exposition families, each checked for its type's suffixes."""
    found = {}
    for family in families:
        names = {sample.name for sample in family.samples}
        assert names == {family.name + suffix for suffix in SUFFIXES[family.type]}, family.name
        query_name = family.name + "_total" if family.type == "counter" else family.name
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        found[query_name] = (family.type, frozenset(labels))
    return found
