"""Write the generated CRDs: `python -m moelora.api [--check]` (run from the repository root)."""

from __future__ import annotations

import argparse
import pathlib
import sys

from moelora.api.crd import custom_resource_definitions, render_yaml

# The chart carries the same bytes (charts/moelora/files/crds/), so `helm install` needs no second step.
TARGETS = (pathlib.Path("crds"), pathlib.Path("charts/moelora/files/crds"))


def rendered_files() -> dict[str, str]:
    return {f"{crd['spec']['names']['plural']}.yaml": render_yaml(crd) for crd in custom_resource_definitions()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the files on disk differ")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered_files().items():
        for path in (target / name for target in TARGETS):
            if args.check:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print("stale, run `python -m moelora.api`: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
