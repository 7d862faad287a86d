"""docs/chart-reference.md, generated from the comments of charts/moelora/values.yaml (the documented contract).

.venv/bin/python tests/chart/values_reference.py            # rewrite docs/chart-reference.md
.venv/bin/python tests/chart/values_reference.py --check    # fail if it is stale (test_chart.py runs this)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
VALUES = ROOT / "charts" / "moelora" / "values.yaml"
REFERENCE = ROOT / "docs" / "chart-reference.md"
# Kubernetes objects given whole (their own fields are Kubernetes' to document): one entry each.
WHOLE = {"resources", "podSecurityContext", "securityContext"}


@dataclasses.dataclass(frozen=True)
class Entry:
    key: str  # dotted path
    default: Any
    description: str
    example: str
    line: int


def entries(text: str) -> list[Entry]:
    """Every documented key of values.yaml, in file order: leaves, and the WHOLE objects."""
    values = yaml.safe_load(text)
    lines = text.splitlines()
    path: list[tuple[int, str]] = []
    result = []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        path = [(i, k) for i, k in path if i < indent] + [(indent, match.group(2))]
        if any(key in WHOLE for _, key in path[:-1]):
            continue
        value: Any = values
        for _, key in path:
            value = value[key]
        if isinstance(value, dict) and value and match.group(2) not in WHOLE:
            continue  # a section, documented by its leaves
        comment: list[str] = []
        for previous in reversed(lines[:number]):
            if not previous.lstrip().startswith("#"):
                break
            comment.insert(0, re.sub(r"^\s*# ?", "", previous))
        body = "\n".join(comment)
        if "-- " not in body:
            raise ValueError(f"values.yaml:{number + 1}: {'.'.join(k for _, k in path)} has no `# --` description")
        body = body[body.index("-- ") + 3 :]
        description, _, example = body.partition("Example:")
        if not description.strip() or not example.strip():
            raise ValueError(
                f"values.yaml:{number + 1}: {'.'.join(k for _, k in path)} needs a description and an example"
            )
        result.append(
            Entry(
                key=".".join(k for _, k in path),
                default=value,
                line=number + 1,
                description=" ".join(description.split()),
                example=example.strip("\n"),
            )
        )
    return result


def _example_value(entry: Entry) -> Any:
    """The example's value: `key: value` (one line or a block) shown as the value alone."""
    parsed = yaml.safe_load(entry.example)
    last = entry.key.rsplit(".", 1)[-1]
    if isinstance(parsed, dict) and list(parsed) == [last]:
        return parsed[last]
    raise ValueError(f"values.yaml:{entry.line}: the example of {entry.key} is not `{last}: ...`")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(text: str) -> str:
    out = [
        "# Helm chart values",
        "",
        (
            "Generated from the comments of `charts/moelora/values.yaml` by `.venv/bin/python "
            "tests/chart/values_reference.py`; do not edit. `values.schema.json` checks the same keys and refuses any "
            "other, so a typo fails `helm install`."
        ),
        "",
        "| key | default | description | example |",
        "|---|---|---|---|",
    ]
    for entry in entries(text):
        default = json.dumps(entry.default, separators=(", ", ": "))
        example = json.dumps(_example_value(entry), separators=(", ", ": "))
        out.append(f"| `{entry.key}` | `{_cell(default)}` | {_cell(entry.description)} | `{_cell(example)}` |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render(VALUES.read_text())
    if args.check:
        if not REFERENCE.exists() or REFERENCE.read_text() != text:
            print(f"stale: run .venv/bin/python {pathlib.Path(__file__).relative_to(ROOT)}", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
