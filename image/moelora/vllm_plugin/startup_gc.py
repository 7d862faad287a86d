"""Keep vLLM's start-up garbage collections off the heap that outlives them (`MOELORA_GC_FREEZE=1`; off by default
until a GPU has measured it).

vLLM's V1 model runner collects in full around its profile run and on both sides of each CUDA-graph capture phase
(`_freeze_gc`: collect, freeze, capture, unfreeze, collect), and each full collection walks the whole heap: about a
million tracked objects in a LoRA server by then (imported code, the model, torch.compile's graphs), half a second
or more each (docs/benchmarks.md). Here the heap alive before the profile run is frozen once, after a collection, as
vLLM itself freezes the heap once start-up ends; and a capture phase keeps frozen what it freezes: collect, freeze,
collector off while capturing (as vLLM 0.33 does: a collection inside a capture can unload a kernel it uses), then
collect what the capture left. An object frozen alive that dies later in a reference cycle stays until something
unfreezes the heap, as after vLLM's own freeze. With VLLM_ENABLE_CUDAGRAPH_GC=1 (collections during capture, asked
of vLLM) vLLM's context stays.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterator

from .patches import Patches

__all__ = ["CAPTURE_GC_ENV", "ENV", "capture_phase", "freeze_heap", "install_startup_gc"]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_GC_FREEZE"
CAPTURE_GC_ENV = "VLLM_ENABLE_CUDAGRAPH_GC"


@contextlib.contextmanager
def capture_phase() -> Iterator[None]:
    """vLLM's capture-phase context without its unfreeze: the heap frozen before stays frozen afterwards."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        try:
            gc.collect()  # what the capture left: only objects made since the freeze are walked
        finally:
            if enabled:
                gc.enable()


def freeze_heap(before: str) -> None:
    """Collect, then freeze every object alive, so later collections walk only what is made from now on."""
    t0 = time.monotonic()
    gc.collect()
    gc.freeze()
    log.info(
        "moelora: %s objects frozen before %s, in %.2f s", f"{gc.get_freeze_count():,}", before, time.monotonic() - t0
    )


def install_startup_gc(patches: Patches) -> str | None:
    """Wrap the V1 model runner's profile run and replace its capture-phase context through `patches`; None when
    done, else why not (nothing changed)."""
    if os.environ.get(ENV, "0") != "1":
        return f"{ENV} is not 1"
    if os.environ.get(CAPTURE_GC_ENV, "0") not in ("", "0"):
        return f"{CAPTURE_GC_ENV} asks vLLM to collect during capture"
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    missing = [name for name in ("_freeze_gc", "profile_run") if not hasattr(GPUModelRunner, name)]
    if missing:
        return f"vLLM's GPUModelRunner lacks {missing}"
    profile = GPUModelRunner.profile_run

    def profile_run(self, *args, **kwargs):  # 0.32 and 0.33 take randomize_inputs
        freeze_heap("the profile run")
        return profile(self, *args, **kwargs)

    patches.set(GPUModelRunner, "profile_run", profile_run)
    patches.set(GPUModelRunner, "_freeze_gc", staticmethod(capture_phase))
    return None
