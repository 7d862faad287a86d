"""The layer contracts of docs/architecture.md, checked by import-linter over the source (`.importlinter`)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def lint_imports(config: pathlib.Path) -> subprocess.CompletedProcess[str]:
    found = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent))
    if found is None:
        pytest.fail("lint-imports not found: install the test extra (import-linter)")
    return subprocess.run(
        [found, "--config", str(config), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_contracts_are_kept() -> None:
    result = lint_imports(ROOT / ".importlinter")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_broken_contract_is_caught(tmp_path: pathlib.Path) -> None:
    """The check above can fail: a contract the tree breaks (the operator does import the API) is reported."""
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    moelora.api\n    moelora.operator\n\n"
        "[importlinter:contract:bogus]\nname = bogus\ntype = forbidden\n"
        "source_modules = moelora.operator\nforbidden_modules = moelora.api\n"
    )
    result = lint_imports(config)
    assert result.returncode != 0 and "BROKEN" in result.stdout
