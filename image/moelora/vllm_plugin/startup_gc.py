"""Keep vLLM's start-up garbage collections off the heap that outlives them (on by default; `MOELORA_GC_FREEZE=0`
leaves vLLM's collections as they are).

vLLM's V1 model runner collects in full around its profile run, the KV-cache sizing and on both sides of each
CUDA-graph capture phase (`_freeze_gc`: collect, freeze, capture, unfreeze, collect), and each full collection walks
the whole heap: about a million tracked objects in a LoRA server by then (imported code, the model, torch.compile's
graphs), half a second or more each (docs/benchmarks.md). Here the heap is collected and frozen before the profile
run, a capture phase keeps frozen what it freezes (collect, freeze, collector off while capturing as
vLLM 0.33 does, since a collection inside a capture can unload a kernel it uses, then collect what the capture left),
and the heap is walked once in full where vLLM drops the profiling KV cache and graphs: unfreeze, vLLM's cleanup
(which collects), freeze again. That cleanup runs before vLLM measures the memory left for the KV cache, so anything
frozen alive and dropped since in a reference cycle is freed before the measurement, as without this. The capture
of the served graphs then walks only new objects, and vLLM freezes the heap itself once start-up ends. Only vLLM's
V1 model runner is patched; with VLLM_ENABLE_CUDAGRAPH_GC=1 (collections during capture, asked of vLLM) nothing is.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterator

from .patches import Patches

__all__ = ["CAPTURE_GC_ENV", "ENV", "capture_phase", "install_startup_gc"]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_GC_FREEZE"
CAPTURE_GC_ENV = "VLLM_ENABLE_CUDAGRAPH_GC"
# vLLM's capture-phase context, by release: a method of the runner (0.26), a function of gc_utils (0.32, 0.33).
PINNED_CONTEXTS = ("_freeze_gc", "freeze_gc_for_cudagraph_capture")


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


def install_startup_gc(patches: Patches) -> str | None:
    """Wrap the V1 model runner's profile run and profiling cleanup and replace its capture-phase context through
    `patches`; None when done, else why not (nothing changed)."""
    if os.environ.get(ENV, "1").strip() == "0":
        return f"{ENV} is 0"
    if os.environ.get(CAPTURE_GC_ENV, "0") not in ("", "0"):
        return f"{CAPTURE_GC_ENV} asks vLLM to collect during capture"
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    missing = [
        n for n in ("_freeze_gc", "profile_run", "_cleanup_profiling_kv_cache") if not hasattr(GPUModelRunner, n)
    ]
    if missing:
        return f"vLLM's GPUModelRunner lacks {missing}"
    context = getattr(vars(GPUModelRunner).get("_freeze_gc"), "__func__", None)
    if getattr(context, "__name__", None) not in PINNED_CONTEXTS:
        return f"vLLM's GPUModelRunner._freeze_gc is {context!r}, not one of {PINNED_CONTEXTS}"
    profile, cleanup = GPUModelRunner.profile_run, GPUModelRunner._cleanup_profiling_kv_cache

    def profile_run(self, *args, **kwargs):  # 0.32 and 0.33 take randomize_inputs
        t0 = time.monotonic()
        gc.collect()  # vLLM's memory profiling has just collected, but a fixed KV-cache size skips it
        gc.freeze()
        frozen = f"{gc.get_freeze_count():,}"
        log.info("moelora: %s objects frozen before the profile run in %.2f s", frozen, time.monotonic() - t0)
        return profile(self, *args, **kwargs)

    def _cleanup_profiling_kv_cache(self):
        frozen = gc.get_freeze_count() > 0  # at start-up; a shutdown has unfrozen the heap and keeps it so
        t0 = time.monotonic()
        gc.unfreeze()  # vLLM's cleanup collects: a full walk here frees what was dropped since the freeze
        try:
            return cleanup(self)
        finally:
            if frozen:
                gc.freeze()
                log.info("moelora: profiling cleanup with a full collection in %.2f s", time.monotonic() - t0)

    patches.set(GPUModelRunner, "profile_run", profile_run)
    patches.set(GPUModelRunner, "_cleanup_profiling_kv_cache", _cleanup_profiling_kv_cache)
    patches.set(GPUModelRunner, "_freeze_gc", staticmethod(capture_phase))
    return None
