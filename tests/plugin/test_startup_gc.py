"""startup_gc (MOELORA_GC_FREEZE=1): off by default; when on, the heap alive before vLLM's profile run is frozen after
a collection, and a capture phase keeps frozen what it froze (vLLM's own context unfreezes it, so every later full
collection walks the whole heap again), with the collector off while capturing and what the capture left collected."""

from __future__ import annotations

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
    gc.collect()
    yield
    gc.unfreeze()
    gc.enable()


@pytest.fixture
def runner_cls():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def test_off_by_default_and_when_vllm_is_asked_to_collect_during_capture(monkeypatch, runner_cls):
    before = (runner_cls.__dict__["_freeze_gc"], runner_cls.__dict__["profile_run"])
    monkeypatch.delenv(startup_gc.ENV, raising=False)
    patches = Patches()
    assert startup_gc.install_startup_gc(patches) == "MOELORA_GC_FREEZE is not 1"
    monkeypatch.setenv(startup_gc.ENV, "1")
    monkeypatch.setenv(startup_gc.CAPTURE_GC_ENV, "1")
    assert "VLLM_ENABLE_CUDAGRAPH_GC" in startup_gc.install_startup_gc(patches)
    assert patches.done == [] and (runner_cls.__dict__["_freeze_gc"], runner_cls.__dict__["profile_run"]) == before


def test_vllms_capture_phase_unfreezes_and_moeloras_keeps_the_heap_frozen(monkeypatch, runner_cls):
    kept = [Knot() for _ in range(1000)]
    with runner_cls._freeze_gc():  # vLLM's own context, as the pinned releases have it
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0  # unfrozen again: the next full collection walks everything

    monkeypatch.setenv(startup_gc.ENV, "1")
    monkeypatch.delenv(startup_gc.CAPTURE_GC_ENV, raising=False)
    patches = Patches()
    assert startup_gc.install_startup_gc(patches) is None
    try:
        garbage_before = dead_knot()
        with runner_cls._freeze_gc():
            assert garbage_before() is None  # collected before the freeze: garbage is never frozen
            assert gc.get_freeze_count() >= len(kept) and not gc.isenabled()
            made_inside = dead_knot()
            assert made_inside() is not None
        assert made_inside() is None  # what the capture left is collected
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)  # and the heap stays frozen
    finally:
        patches.undo()
    assert runner_cls._freeze_gc is not startup_gc.capture_phase and kept


def test_a_capture_phase_leaves_a_disabled_collector_disabled(monkeypatch):
    gc.disable()
    with startup_gc.capture_phase():
        pass
    assert not gc.isenabled()


def test_the_profile_run_starts_on_a_collected_frozen_heap(monkeypatch, runner_cls, plugin_log):
    seen = {}

    def profile_run(self, randomize_inputs=False):
        seen["frozen"] = gc.get_freeze_count()
        seen["garbage"] = garbage()
        return "profiled"

    monkeypatch.setattr(runner_cls, "profile_run", profile_run)
    monkeypatch.setenv(startup_gc.ENV, "1")
    monkeypatch.delenv(startup_gc.CAPTURE_GC_ENV, raising=False)
    patches = Patches()
    assert startup_gc.install_startup_gc(patches) is None
    try:
        garbage = dead_knot()
        assert runner_cls.profile_run(object(), randomize_inputs=False) == "profiled"
    finally:
        patches.undo()
    assert runner_cls.profile_run is profile_run
    assert seen["frozen"] > 0 and seen["garbage"] is None
    assert any("objects frozen before the profile run" in line for line in plugin_log)
