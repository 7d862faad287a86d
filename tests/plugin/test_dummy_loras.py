"""dummy_loras: vLLM's warm-up dummy adapter made once per start-up, through vLLM's own per-phase cache.

The worker manager is vLLM's (its dummy_lora_cache and add_dummy_lora, wrapped); its model manager stands in, making
a real LoRAModel of zero weights per create_dummy_lora call and counting the calls. The GPU worker's
compile_or_warm_up_model stands in for the start-up's warm-ups and capture.
"""

from __future__ import annotations

import pytest
import torch

from moelora.vllm_plugin import dummy_loras
from moelora.vllm_plugin.patches import Patches


class Manager:
    """The model manager's part add_dummy_lora uses: create_dummy_lora and the adapters added."""

    def __init__(self) -> None:
        self.created: list[tuple[int, int]] = []
        self.added: dict[int, object] = {}

    def create_dummy_lora(self, lora_id, rank, embedding_modules=None):
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.lora_weights import LoRALayerWeights

        self.created.append((lora_id, rank))
        weights = LoRALayerWeights.create_dummy_lora_weights("layers.0.mlp.experts", 64, 32, rank, torch.float32, "cpu")
        return LoRAModel(lora_id, rank, {"layers.0.mlp.experts": weights})

    def add_adapter(self, model) -> bool:
        self.added[model.id] = model
        return True

    def list_adapters(self):
        return dict(self.added)

    def remove_all_adapters(self) -> None:
        self.added.clear()


@pytest.fixture
def worker(monkeypatch):
    """vLLM's worker manager over the stand-in manager, with the part installed (and undone after)."""
    from vllm.lora.worker_manager import WorkerLoRAManager
    from vllm.v1.worker import gpu_worker

    monkeypatch.delenv(dummy_loras.ENV, raising=False)
    monkeypatch.setattr(gpu_worker.Worker, "compile_or_warm_up_model", lambda self: "warmed")
    patches = Patches()
    assert dummy_loras.install_dummy_loras(patches) is None
    manager = object.__new__(WorkerLoRAManager)
    manager._adapter_manager = Manager()
    manager._cached_dummy_lora = False
    manager.embedding_modules = {}
    yield manager
    patches.undo()


def phase(manager, rank: int = 8, slots: int = 4) -> list:
    """One warm-up phase as vLLM's maybe_setup_dummy_loras runs it: the cache, a dummy per slot, all removed after."""
    from vllm.lora.request import LoRARequest

    with manager.dummy_lora_cache():
        for slot in range(1, slots + 1):
            manager.add_dummy_lora(LoRARequest(f"warmup_{slot}", slot, "/not/a/real/path"), rank=rank)
    added = [manager._adapter_manager.added[slot] for slot in range(1, slots + 1)]
    manager._adapter_manager.remove_all_adapters()
    return added


def storage(model) -> int:
    return model.loras["layers.0.mlp.experts"].lora_a.untyped_storage().data_ptr()


def test_later_phases_clone_the_first_phases_dummy_until_the_start_up_ends(worker, plugin_log):
    from vllm.v1.worker import gpu_worker

    first, second = phase(worker), phase(worker)
    assert worker._adapter_manager.created == [(1, 8)]  # vLLM alone: once per phase
    assert [m.id for m in second] == [1, 2, 3, 4] and {storage(m) for m in first + second} == {storage(first[0])}
    assert all(torch.count_nonzero(w) == 0 for m in second for w in (m.loras["layers.0.mlp.experts"].lora_a,))
    assert worker._cached_dummy_lora is False  # vLLM's cache is closed outside a phase, as before
    assert len([line for line in plugin_log if "dummy adapter of rank 8 kept" in line]) == 1
    assert gpu_worker.Worker.compile_or_warm_up_model(object()) == "warmed"
    phase(worker)
    assert worker._adapter_manager.created == [(1, 8), (1, 8)]  # dropped at the start-up's end: made afresh


def test_a_phase_at_another_rank_makes_its_own(worker):
    phase(worker, rank=8)
    sixteen = phase(worker, rank=16)
    phase(worker, rank=16)
    assert worker._adapter_manager.created == [(1, 8), (1, 16)]
    assert all(m.rank == 16 for m in sixteen)


def test_outside_a_phase_every_dummy_is_made_and_none_kept(worker):
    from vllm.lora.request import LoRARequest

    worker.add_dummy_lora(LoRARequest("warmup_1", 1, "/not/a/real/path"), rank=8)
    worker.add_dummy_lora(LoRARequest("warmup_2", 2, "/not/a/real/path"), rank=8)
    worker._adapter_manager.remove_all_adapters()
    phase(worker)
    assert worker._adapter_manager.created == [(1, 8), (2, 8), (1, 8)]


def test_the_kept_dummy_goes_when_the_warm_up_fails_too(monkeypatch):
    from vllm.lora.worker_manager import WorkerLoRAManager
    from vllm.v1.worker import gpu_worker

    def failing(self):
        raise RuntimeError("capture failed")

    monkeypatch.delenv(dummy_loras.ENV, raising=False)
    monkeypatch.setattr(gpu_worker.Worker, "compile_or_warm_up_model", failing)
    patches = Patches()
    assert dummy_loras.install_dummy_loras(patches) is None
    try:
        manager = object.__new__(WorkerLoRAManager)
        manager._adapter_manager, manager._cached_dummy_lora, manager.embedding_modules = Manager(), False, {}
        phase(manager)
        with pytest.raises(RuntimeError, match="capture failed"):
            gpu_worker.Worker.compile_or_warm_up_model(object())
        phase(manager)
        assert manager._adapter_manager.created == [(1, 8), (1, 8)]
    finally:
        patches.undo()
    assert gpu_worker.Worker.compile_or_warm_up_model is failing  # undone: vLLM's (here the stand-in) is back


def test_switched_off_or_on_another_signature_nothing_is_patched(monkeypatch):
    from vllm.lora.worker_manager import WorkerLoRAManager

    monkeypatch.setenv(dummy_loras.ENV, "0")
    patches = Patches()
    assert dummy_loras.install_dummy_loras(patches) == f"{dummy_loras.ENV}=0" and patches.done == []
    monkeypatch.delenv(dummy_loras.ENV)
    monkeypatch.setattr(WorkerLoRAManager, "add_dummy_lora", lambda self, lora_request: None)
    reason = dummy_loras.install_dummy_loras(patches)
    assert reason is not None and "add_dummy_lora" in reason and patches.done == []
