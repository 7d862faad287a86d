"""The start-up profile (MOELORA_PROFILE_STARTUP): off by default, a file and a log line per phase when on, and the
model warm-up and graph capture wrapped in it."""

from __future__ import annotations

import pathlib

import pytest

from moelora.vllm_plugin import startup_profile
from moelora.vllm_plugin.patches import Patches


def busy_helper(n: int) -> int:
    return sum(i * i for i in range(n))


def phase_work(n: int) -> int:
    return busy_helper(n) + busy_helper(n // 2)


def test_without_the_variable_nothing_is_profiled_or_written(monkeypatch, tmp_path, plugin_log):
    monkeypatch.delenv(startup_profile.PROFILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert startup_profile.profiled("capture", phase_work, 1000) == phase_work(1000)
    assert list(tmp_path.iterdir()) == [] and not any("cProfile" in line for line in plugin_log)


def test_a_phase_writes_its_functions_and_logs_the_costliest(monkeypatch, tmp_path, plugin_log):
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path / "prof"))
    assert startup_profile.profiled("capture", phase_work, 200_000) == phase_work(200_000)
    (written,) = (tmp_path / "prof").iterdir()
    assert written.name.startswith("capture-") and written.suffix == ".txt"
    text = written.read_text()
    assert text.startswith("capture: ") and "busy_helper" in text and "phase_work" in text
    assert text.count("Ordered by") == 2  # cumulative, then own time
    (line,) = [line for line in plugin_log if "under cProfile" in line]
    assert "capture took" in line and str(written) in line and "costliest:" in line and "calls" in line


def test_a_phase_that_raises_still_leaves_its_profile(monkeypatch, tmp_path):
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path))

    def failing() -> None:
        busy_helper(1000)
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        startup_profile.profiled("capture", failing)
    (written,) = tmp_path.iterdir()
    assert "failing" in written.read_text()


def test_an_unwritable_folder_costs_a_warning_not_the_start_up(monkeypatch, tmp_path, plugin_log):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(blocker / "prof"))  # a folder under a file
    assert startup_profile.profiled("capture", phase_work, 10) == phase_work(10)
    assert any("profile of capture not written" in line for line in plugin_log)


def test_model_warmup_and_vllms_kernel_warmup_are_profiled_apart(monkeypatch, tmp_path):
    from vllm.model_executor.warmup import kernel_warmup as warmup_module
    from vllm.v1.worker import gpu_worker

    from moelora.vllm_plugin import model_warmup

    def vllms(worker, **kw):
        busy_helper(100)

    monkeypatch.setattr(warmup_module, "kernel_warmup", vllms)
    monkeypatch.setattr(gpu_worker, "kernel_warmup", vllms)
    monkeypatch.setattr(model_warmup, "warm_model", lambda worker: busy_helper(100))
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path))
    patches = Patches()
    assert model_warmup.install_model_warmup(patches) is None
    try:
        gpu_worker.kernel_warmup("w")
    finally:
        patches.undo()
    assert sorted(p.name.split("-")[:-1] for p in tmp_path.iterdir()) == [
        ["moelora", "model", "warmup"],
        ["vllm", "kernel", "warmup"],
    ]


def test_graph_capture_is_profiled(monkeypatch, tmp_path: pathlib.Path):
    from vllm.v1.worker import gpu_model_runner as runner_module

    from moelora.vllm_plugin import host_adapters

    captured = []
    monkeypatch.setattr(runner_module.GPUModelRunner, "capture_model", lambda self: captured.append(self) or 7)
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path))
    patches = Patches()
    assert host_adapters.install_host_adapters(patches) is None
    try:
        assert runner_module.GPUModelRunner.capture_model("runner") == 7
    finally:
        patches.undo()
    assert captured == ["runner"]
    assert [p.name.split("-")[:-1] for p in tmp_path.iterdir()] == [["vllm", "capture", "model"]]
