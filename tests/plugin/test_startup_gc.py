"""startup_gc (on by default, MOELORA_GC_FREEZE=0 off): when on, the heap is frozen before vLLM's profile run, a capture
phase keeps frozen what it froze (vLLM's own context unfreezes it, so every later full collection walks the whole heap
again) with the collector off while capturing, and vLLM's profiling cleanup walks the whole heap once, so what was
dropped since a freeze is freed before vLLM measures the memory left."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest

from moelora.vllm_plugin import startup_gc
from moelora.vllm_plugin.patches import Patches


class Knot:
    """A reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def dead_knot() -> weakref.ref:
    return weakref.ref(Knot())  # unreachable at once, freed only by a collection


@pytest.fixture(autouse=True)
def collector_as_found():
    yield
    gc.unfreeze()
    gc.enable()


@pytest.fixture
def runner_cls():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


@contextlib.contextmanager
def installed(monkeypatch):
    """startup_gc installed as a server has it by default, undone afterwards."""
    monkeypatch.delenv(startup_gc.ENV, raising=False)
    monkeypatch.delenv(startup_gc.CAPTURE_GC_ENV, raising=False)
    patches = Patches()
    assert startup_gc.install_startup_gc(patches) is None
    try:
        yield
    finally:
        patches.undo()


def test_off_when_asked_when_vllm_collects_during_capture_and_for_an_unknown_context(monkeypatch, runner_cls):
    names = ("_freeze_gc", "profile_run", "_cleanup_profiling_kv_cache")
    before = [runner_cls.__dict__[name] for name in names]
    monkeypatch.setenv(startup_gc.ENV, "0")
    patches = Patches()
    assert startup_gc.install_startup_gc(patches) == "MOELORA_GC_FREEZE is 0"
    monkeypatch.delenv(startup_gc.ENV)
    monkeypatch.setenv(startup_gc.CAPTURE_GC_ENV, "1")
    assert "VLLM_ENABLE_CUDAGRAPH_GC" in startup_gc.install_startup_gc(patches)
    monkeypatch.delenv(startup_gc.CAPTURE_GC_ENV)
    monkeypatch.setattr(runner_cls, "_freeze_gc", staticmethod(contextlib.nullcontext))  # another release's context
    assert "not one of" in startup_gc.install_startup_gc(patches)
    monkeypatch.undo()
    assert patches.done == [] and [runner_cls.__dict__[name] for name in names] == before


def test_vllms_capture_phase_unfreezes_and_moeloras_keeps_the_heap_frozen(monkeypatch, runner_cls):
    kept = [Knot() for _ in range(1000)]
    with runner_cls._freeze_gc():  # vLLM's own context, as the pinned releases have it
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0  # unfrozen again: the next full collection walks everything

    with installed(monkeypatch):
        garbage_before = dead_knot()
        with runner_cls._freeze_gc():
            assert garbage_before() is None  # collected before the freeze: garbage is never frozen
            assert gc.get_freeze_count() >= len(kept) and not gc.isenabled()
            made_inside = dead_knot()
            assert made_inside() is not None
        assert made_inside() is None  # what the capture left is collected
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)  # and the heap stays frozen
    assert runner_cls._freeze_gc is not startup_gc.capture_phase and kept


def test_a_capture_phase_restores_the_collector_when_the_capture_fails():
    with pytest.raises(RuntimeError, match="capture failed"), startup_gc.capture_phase():
        raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    with startup_gc.capture_phase():
        pass
    assert not gc.isenabled()  # a collector that was off stays off


def test_the_profile_run_starts_on_a_collected_frozen_heap(monkeypatch, runner_cls, plugin_log):
    seen = {}

    def profile_run(self, randomize_inputs=False):
        seen["frozen"] = gc.get_freeze_count()
        seen["garbage"] = garbage()
        return "profiled"

    monkeypatch.setattr(runner_cls, "profile_run", profile_run)
    kept = [Knot() for _ in range(1000)]
    with installed(monkeypatch):
        garbage = dead_knot()  # collected first: garbage is never frozen
        assert runner_cls.profile_run(object(), randomize_inputs=False) == "profiled"
    assert runner_cls.profile_run is profile_run
    assert seen["frozen"] >= len(kept) and seen["garbage"] is None
    assert any("objects frozen before the profile run" in line for line in plugin_log)


def test_the_profiling_cleanup_frees_what_was_dropped_while_frozen_and_freezes_again(monkeypatch, runner_cls):
    def cleanup(self):
        seen["frozen during"] = gc.get_freeze_count()
        gc.collect()  # as vLLM's cleanup does

    seen = {}
    monkeypatch.setattr(runner_cls, "_cleanup_profiling_kv_cache", cleanup)
    with installed(monkeypatch):
        dropped = Knot()
        gone = weakref.ref(dropped)
        gc.freeze()  # alive when the heap was frozen (e.g. the profiling KV cache) ...
        del dropped  # ... and dropped in a cycle since: a collection of a frozen heap would never free it
        gc.collect()
        assert gone() is not None
        runner_cls._cleanup_profiling_kv_cache(object())
        assert gone() is None and seen["frozen during"] == 0 and gc.get_freeze_count() > 0
        gc.unfreeze()  # as a shutdown does first: the cleanup then leaves the heap unfrozen
        runner_cls._cleanup_profiling_kv_cache(object())
        assert gc.get_freeze_count() == 0
