"""moelora-local is its own distribution for development only: no image can get it, and it stands on its own."""

from __future__ import annotations

import ast
import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCAL = ROOT / "local" / "moelora" / "local"


def test_the_root_distribution_does_not_package_the_local_stack() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = root["tool"]["setuptools"]
    assert not [p for p in setuptools["packages"] if p.startswith("moelora.local")]
    assert not [p for p in setuptools["package-dir"] if p.startswith("moelora.local")]
    assert "local" not in root["project"]["optional-dependencies"]
    # Never by name: moelora-local is on no index, so a name would let an index's same-named package stand in.
    assert not [r for extra in root["project"]["optional-dependencies"].values() for r in extra if "local" in r]


def test_the_local_distribution_requires_the_operator_and_the_agent() -> None:
    local = tomllib.loads((ROOT / "local" / "pyproject.toml").read_text())["project"]
    assert local["name"] == "moelora-local"
    assert "moelora[operator,agent]" in local["dependencies"]
    assert "kmock==0.8" in local["dependencies"]


def test_neither_image_copies_local() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copied and not [src for sources in copied for src in sources if src.rstrip("/").startswith("local")]
    allowed = [line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    assert allowed and not [path for path in allowed if path.rstrip("/").startswith("local")]


def test_no_module_finds_repository_folders_from_its_own_location() -> None:
    for path in LOCAL.rglob("*.py"):
        assert "__file__" not in path.read_text(), f"{path.relative_to(ROOT)} builds a path from its own location"


def test_modules_stay_small_and_packages_say_what_belongs_in_them() -> None:
    for path in LOCAL.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, f"{path.relative_to(ROOT)} is over 400 lines"
        assert re.fullmatch(r"[a-z0-9_]+\.py", path.name), path.name
        if path.name == "__init__.py":
            assert ast.get_docstring(ast.parse(path.read_text())), f"{path.relative_to(ROOT)} has no docstring"
