"""The start-up profile (MOELORA_PROFILE_STARTUP): off by default; when on, one profile from the LoRA manager's
creation to the end of graph capture, written to a file and summed up in a log line."""

from __future__ import annotations

import pstats
import re
from types import SimpleNamespace

import pytest

from moelora.vllm_plugin import startup_profile
from moelora.vllm_plugin.patches import Patches


def busy_helper(n: int) -> int:
    return sum(i * i for i in range(n))


def phase_work(n: int) -> int:
    return busy_helper(n) + busy_helper(n // 2)


@pytest.fixture(autouse=True)
def no_profile_left_running():
    yield
    startup_profile.stop()  # a failed test must not leave its profiler on the next one's thread


def test_without_the_variable_nothing_is_profiled_or_written(monkeypatch, tmp_path, plugin_log):
    monkeypatch.delenv(startup_profile.PROFILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    startup_profile.start("engine-init")
    phase_work(1000)
    startup_profile.stop()
    assert list(tmp_path.iterdir()) == [] and plugin_log == []


def test_a_profile_writes_its_functions_and_logs_the_costliest(monkeypatch, tmp_path, plugin_log):
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path / "prof"))
    startup_profile.start("engine-init")
    startup_profile.start("another")  # one profile at a time: this one is ignored
    phase_work(200_000)
    startup_profile.stop()
    startup_profile.stop()  # nothing left to stop
    written, raw = sorted((tmp_path / "prof").iterdir(), key=lambda path: path.suffix != ".txt")
    assert written.name.startswith("engine-init-") and written.suffix == ".txt" and raw == written.with_suffix(".prof")
    assert any(name == "busy_helper" for _, _, name in pstats.Stats(str(raw)).stats)  # type: ignore[attr-defined]
    text = written.read_text()
    assert text.startswith("engine-init: ") and "busy_helper" in text and "phase_work" in text
    assert text.count("Ordered by") == 2  # cumulative, then own time
    (line,) = [line for line in plugin_log if "under cProfile" in line]
    assert "engine-init took" in line and str(written) in line and "costliest:" in line and "calls" in line


def test_an_unwritable_folder_costs_a_warning_not_the_start_up(monkeypatch, tmp_path, plugin_log):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(blocker / "prof"))  # a folder under a file
    startup_profile.start("engine-init")
    phase_work(10)
    startup_profile.stop()
    assert any("profile of engine-init not written" in line for line in plugin_log)


def install_over(monkeypatch, tmp_path, **phases) -> Patches:
    """host_adapters installed over stand-ins for vLLM's LoRA manager creation and the capture phases named, with
    the profile written to tmp_path; the caller undoes the patches."""
    from vllm.lora import worker_manager
    from vllm.v1.worker import gpu_model_runner as runner_module

    from moelora.vllm_plugin import host_adapters

    def create_lora_manager(self, model, vllm_config):
        busy_helper(1000)
        return "lora model"

    monkeypatch.setattr(worker_manager.LRUCacheWorkerLoRAManager, "create_lora_manager", create_lora_manager)
    for name, stand_in in phases.items():
        monkeypatch.setattr(runner_module.GPUModelRunner, name, stand_in)
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path))
    monkeypatch.delenv(host_adapters.AHEAD_ENV, raising=False)
    patches = Patches()
    assert host_adapters.install_host_adapters(patches) is None
    return patches


def the_profile(folder) -> tuple[str, str]:
    """The one profile written into `folder`: its file's name and text."""
    (written,) = folder.glob("*.txt")
    return written.name, written.read_text()


def test_the_profile_runs_from_the_lora_manager_to_the_end_of_graph_capture(monkeypatch, tmp_path):
    from vllm.lora import worker_manager
    from vllm.v1.worker import gpu_model_runner as runner_module

    def capture_model(self):
        phase_work(1000)
        raise RuntimeError("capture failed")  # the profile is written all the same

    patches = install_over(monkeypatch, tmp_path, capture_model=capture_model)
    try:
        assert worker_manager.LRUCacheWorkerLoRAManager.create_lora_manager(object(), None, None) == "lora model"
        assert list(tmp_path.iterdir()) == []  # still running
        with pytest.raises(RuntimeError, match="capture failed"):
            runner_module.GPUModelRunner.capture_model(object())
    finally:
        patches.undo()
    name, text = the_profile(tmp_path)
    assert name.startswith("engine-init-") and "create_lora_manager" in text and "phase_work" in text


def test_from_graph_capture_the_profile_leaves_out_what_comes_before_it(monkeypatch, tmp_path, plugin_log):
    from vllm.lora import worker_manager
    from vllm.v1.worker import gpu_model_runner as runner_module

    def profile_cudagraph_memory(self):
        phase_work(1000)

    def capture_model(self):
        sum(range(1000))

    monkeypatch.setenv(startup_profile.FROM_ENV, "graph-capture")
    patches = install_over(
        monkeypatch, tmp_path, profile_cudagraph_memory=profile_cudagraph_memory, capture_model=capture_model
    )
    try:
        worker_manager.LRUCacheWorkerLoRAManager.create_lora_manager(object(), None, None)
        runner_module.GPUModelRunner.profile_cudagraph_memory(object())
        assert list(tmp_path.iterdir()) == []  # from the first capture phase to the end of the last
        runner_module.GPUModelRunner.capture_model(object())
    finally:
        patches.undo()
    name, text = the_profile(tmp_path)
    assert name.startswith("graph-capture-") and "phase_work" in text and "capture_model" in text
    assert "create_lora_manager" not in text


def test_an_unknown_starting_phase_is_warned_of_and_profiles_from_the_first(monkeypatch, tmp_path, plugin_log):
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path))
    monkeypatch.setenv(startup_profile.FROM_ENV, "capture")  # not a phase's name
    startup_profile.start("graph-capture")
    assert list(tmp_path.iterdir()) == [] and not startup_profile._running
    startup_profile.start("engine-init")
    startup_profile.stop()
    assert [path.name.split("-")[1] for path in tmp_path.glob("*.txt")] == ["init"]
    assert any("MOELORA_PROFILE_STARTUP_FROM='capture' is none of" in line for line in plugin_log)


def test_without_graph_capture_the_profile_ends_after_vllms_kernel_warm_up(monkeypatch, tmp_path):
    from vllm.model_executor.warmup import kernel_warmup as warmup_module
    from vllm.v1.worker import gpu_worker

    from moelora.vllm_plugin import model_warmup

    monkeypatch.setattr(warmup_module, "kernel_warmup", lambda worker: busy_helper(100))
    monkeypatch.setattr(gpu_worker, "kernel_warmup", warmup_module.kernel_warmup)
    monkeypatch.setattr(model_warmup, "warm_model", lambda worker: None)
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path))
    patches = Patches()
    assert model_warmup.install_model_warmup(patches) is None
    try:
        startup_profile.start("engine-init")
        gpu_worker.kernel_warmup(SimpleNamespace(model_config=SimpleNamespace(enforce_eager=False)))
        assert list(tmp_path.iterdir()) == []  # graph capture follows: still running
        gpu_worker.kernel_warmup(SimpleNamespace(model_config=SimpleNamespace(enforce_eager=True)))
    finally:
        patches.undo()
    (written,) = tmp_path.glob("*.txt")
    assert written.name.startswith("engine-init-")


class Knot:
    """A reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_the_gc_watch_logs_slow_collections_with_the_heaps_commonest_types(monkeypatch, plugin_log):
    import gc

    monkeypatch.delenv(startup_profile.PROFILE_ENV, raising=False)
    monkeypatch.setenv(startup_profile.GC_ENV, "1")
    monkeypatch.setattr(startup_profile, "SLOW_MS", 0.0)  # every collection counts as slow here
    callbacks = list(gc.callbacks)
    startup_profile.start("engine-init")
    startup_profile.start("again")  # one watch at a time
    assert len(gc.callbacks) == len(callbacks) + 1
    enabled = gc.isenabled()
    gc.disable()  # the explicit collection only: an automatic one could come before the knots exist
    try:
        kept = [Knot() for _ in range(200_000)]  # more than any type of a test worker's heap
        [Knot() for _ in range(20_000)]  # garbage in cycles
        gc.collect()
    finally:
        if enabled:
            gc.enable()
    startup_profile.stop()
    assert gc.callbacks == callbacks and kept
    (full,) = [line for line in plugin_log if "gc (generation 2) took" in line]
    assert int(re.search(r"(\d+) collected", full)[1]) >= 20_000 and "commonest:" in full
    assert f"{__name__}.Knot" in full.split("commonest:")[1]  # the kept knots are among the heap's commonest
    (summary,) = [line for line in plugin_log if "garbage collection during the start-up" in line]
    assert "full ones in" in summary


def test_without_the_gc_variable_the_collector_is_not_watched(monkeypatch, plugin_log):
    import gc

    monkeypatch.delenv(startup_profile.PROFILE_ENV, raising=False)
    monkeypatch.delenv(startup_profile.GC_ENV, raising=False)
    callbacks = list(gc.callbacks)
    startup_profile.start("engine-init")
    assert gc.callbacks == callbacks
    gc.collect()
    startup_profile.stop()
    assert not any("gc" in line for line in plugin_log)


def test_by_samples_the_engine_thread_alone_is_profiled(monkeypatch, tmp_path, plugin_log):
    import threading

    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path / "prof"))
    monkeypatch.setenv(startup_profile.BY_ENV, "samples")
    stop = threading.Event()

    def busy_beside() -> None:
        while not stop.is_set():
            busy_helper(1000)

    beside = threading.Thread(target=busy_beside)
    beside.start()
    try:
        startup_profile.start("engine-init")
        phase_work(3_000_000)
        startup_profile.stop()
    finally:
        stop.set()
        beside.join()
    (written,) = (tmp_path / "prof").iterdir()  # text only: no raw profile
    text = written.read_text()
    assert text.startswith("engine-init: ") and "the engine's thread sampled" in text and "phase_work" in text
    assert "busy_beside" not in text  # the thread beside it, busy all along
    (line,) = [line for line in plugin_log if ", sampled (" in line]
    assert "engine-init took" in line and str(written) in line and "costliest:" in line


def test_an_unknown_profiler_is_warned_of_and_cprofile_runs(monkeypatch, tmp_path, plugin_log):
    monkeypatch.setenv(startup_profile.PROFILE_ENV, str(tmp_path))
    monkeypatch.setenv(startup_profile.BY_ENV, "perf")
    startup_profile.start("engine-init")
    phase_work(1000)
    startup_profile.stop()
    assert any("MOELORA_PROFILE_STARTUP_BY='perf' is none of" in line for line in plugin_log)
    assert sorted(path.suffix for path in tmp_path.iterdir()) == [".prof", ".txt"]
