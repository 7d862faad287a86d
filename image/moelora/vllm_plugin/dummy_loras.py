"""vLLM's warm-up dummy adapters made once per start-up instead of once per warm-up phase (CUDA).

Each of vLLM's start-up phases that runs the model with LoRA slots filled (the profile run, the graph-memory profile,
the compile warm-up, each CUDA-graph capture phase, the plugin's model warm-up) enters
`WorkerLoRAManager.dummy_lora_cache`, makes one zero adapter of the warm-up rank over every LoRA module
(`LoRAModelManager.create_dummy_lora`: a pinned zero tensor per expert and projection, the experts' then stacked) and
clones it for the other slots; leaving the phase forgets it. With LoRA on every expert of a large MoE that is tens of
thousands of tensors per phase, and the plugin's pinned copy of the stacked ones (adapter_pinning): 0.4 s a phase at
8 of Qwen3-30B-A3B's 48 layers on an H100 host (docs/benchmarks.md).

Installed, the first dummy a worker's manager makes at a rank is kept, and every later phase clones it, as vLLM's own
cache does inside one phase: a clone shares the tensors, which hold zeros that nothing writes (an adapter's weights
are copied into the GPU's slots on activation, never written back). The kept dummies go when the worker's
`compile_or_warm_up_model` returns, after graph capture or the eager warm-up, so serving holds none.
`MOELORA_DUMMY_ONCE=0` keeps vLLM's way.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

from .contract import ADD_DUMMY_LORA_PARAMETERS, WARM_UP_PARAMETERS
from .patches import Patches

__all__ = ["ENV", "install_dummy_loras"]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_DUMMY_ONCE"

_kept: dict[tuple[int, int], Any] = {}  # (id of the worker's LoRA manager, rank) -> the first dummy made there


def install_dummy_loras(patches: Patches) -> str | None:
    """Wrap WorkerLoRAManager.add_dummy_lora and the GPU worker's compile_or_warm_up_model through `patches`; None
    when done, else why not (nothing changed)."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    import vllm.lora.worker_manager as worker_module
    import vllm.v1.worker.gpu_worker as gpu_worker

    add = vars(worker_module.WorkerLoRAManager).get("add_dummy_lora")
    warm = vars(gpu_worker.Worker).get("compile_or_warm_up_model")
    for name, found, expected in (
        ("WorkerLoRAManager.add_dummy_lora", add, ADD_DUMMY_LORA_PARAMETERS),
        ("Worker.compile_or_warm_up_model", warm, WARM_UP_PARAMETERS),
    ):
        if found is None or tuple(inspect.signature(found).parameters) != expected:
            return f"vLLM's {name} is not {expected}"
    assert add is not None and warm is not None

    def add_dummy_lora(self, lora_request, rank):
        key = (id(self), rank)
        if self._cached_dummy_lora is None and key in _kept:  # inside vLLM's phase cache, nothing made in it yet
            self._cached_dummy_lora = _kept[key]
        added = add(self, lora_request, rank)
        made = self._cached_dummy_lora
        if key not in _kept and getattr(made, "rank", None) == rank:  # a dummy made in this phase (not None/False)
            _kept[key] = made
            log.info("moelora: the warm-up's dummy adapter of rank %d kept for the start-up's other phases", rank)
        return added

    def compile_or_warm_up_model(self):
        try:
            return warm(self)
        finally:
            _kept.clear()  # start-up is over: serving makes no dummies

    patches.set(worker_module.WorkerLoRAManager, "add_dummy_lora", add_dummy_lora)
    patches.set(gpu_worker.Worker, "compile_or_warm_up_model", compile_or_warm_up_model)
    patches.on_undo(_kept.clear)
    return None
