"""The tree stays as docs/architecture.md describes it: ruff-clean, and no runtime module past 400 lines."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What the images run; the kernel tools and the local stack are development code and not held to the limit.
RUNTIME = [
    ROOT / "operator" / "moelora",
    ROOT / "image" / "moelora",
    ROOT / "kernels" / "moelora",
]
MAX_LINES = 400


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent))
    if found is None:
        pytest.fail("ruff not found: install the test extra")
    return subprocess.run([found, *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_check_is_clean() -> None:
    result = ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = ruff("format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_would_catch_a_problem(tmp_path: pathlib.Path) -> None:
    """The checks above can fail: with the project's settings, an unused import and a long line are flagged."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx = '" + "a" * 130 + "'\n")
    result = ruff("check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert result.returncode != 0 and "F401" in result.stdout and "E501" in result.stdout


def runtime_modules() -> list[pathlib.Path]:
    return sorted(
        path
        for root in RUNTIME
        for path in root.rglob("*.py")
        if "tools" not in path.relative_to(root).parts and "__pycache__" not in path.parts
    )


def test_no_runtime_module_is_longer_than_the_limit() -> None:
    assert len(runtime_modules()) > 40
    long = {
        str(path.relative_to(ROOT)): n
        for path in runtime_modules()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by concern (at most {MAX_LINES} lines each)"
