"""Run the whole model at every token-count class before serving, so no request pays a Triton JIT compile (CUDA).

vLLM compiles at start-up only what its profile run (max_num_batched_tokens) and CUDA-graph capture (<= the
largest capture size) touch. A batch of another size can still meet a Triton kernel variant not compiled yet:
launch configurations change with the token count, and Triton specialises integer arguments on their value class
(1, a multiple of 16, other), and the token count and its multiples by top_k reach kernels as such arguments.
Compiling our kernels and vLLM's dense LoRA kernels at start-up (moe_hooks, dense_warmup) leaves out vLLM's base
`fused_moe_kernel`, which would otherwise compile under the first requests (docs/benchmarks-history.md, "vLLM end
to end").

This wraps vLLM's `kernel_warmup` (which the GPU worker calls once, before graph capture) so that it first runs
vLLM's own dummy forward pass, `_dummy_run`, the call vLLM's compile_sizes warm-up makes, with every LoRA slot
active, at token counts next to each configuration boundary in each class, then computes logits once with those
slots still active (an adapter on lm_head); then vLLM's own warm-up. Any failure is logged and serving starts as
before. A finished warm-up leaves a marker in Triton's cache (warm_marker.py): a later pod of the same server on the
same cache (a second pod through compileCache) finds every variant there and runs only the largest count's pass
and the logits, unless `MOELORA_WARMUP=always`: a variant found on disk still has to be loaded into the process,
and without that pass the first prompts would load the dense LoRA kernels and vLLM's eager-size variants.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from . import WARMUP_ENV, startup_profile, warm_marker, warmups_on
from .contract import DUMMY_RUN_PARAMETERS, KERNEL_WARMUP_PARAMETERS
from .patches import Patches

__all__ = ["ANCHORS", "OFFSETS", "install_model_warmup", "warm_token_counts"]

log = logging.getLogger("vllm.moelora_plugin")

# Where launch configurations change (vLLM's fused-MoE defaults, our table's buckets 16..1024 on a log scale,
# the dense tuned files' 1..8192) and a point between each pair of them.
ANCHORS = (32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
# M % 16 == 0; odd M (M and M x top_k both "other"); M = 2 mod 4 (M x 8 a multiple of 16, M x 4 not);
# M = 4 mod 16 (M x 4 a multiple of 16, M not).
OFFSETS = (0, 1, 2, 4)

_original: dict[str, Callable[..., object]] = {}
WORKER_MODULE = "vllm.v1.worker.gpu_worker"  # binds kernel_warmup by name when it is imported


def warm_token_counts(max_tokens: int, graph_max: int) -> list[int]:
    """Token counts to run: each anchor plus each offset, above the graph-captured sizes (capture compiles those,
    and smaller batches are padded to a captured size) and up to the scheduler's token budget."""
    counts = {anchor + offset for anchor in ANCHORS for offset in OFFSETS}
    return sorted(m for m in counts if graph_max < m <= max_tokens)


def warm_model(worker: Any) -> None:
    """Dummy forward passes at warm_token_counts, every LoRA slot active, then logits once; never raises."""
    if not warmups_on():
        return
    runner: Any = getattr(worker, "model_runner", None)
    if getattr(worker, "use_v2_model_runner", False) or not hasattr(runner, "_dummy_run"):
        log.info("moelora: model warm-up skipped (not vLLM's V1 GPU model runner)")
        return
    missing = DUMMY_RUN_PARAMETERS - set(inspect.signature(runner._dummy_run).parameters)
    if missing or not hasattr(runner, "maybe_remove_all_loras"):
        log.info(
            "moelora: model warm-up skipped (vLLM's model runner lacks %s)",
            sorted(missing) or ["maybe_remove_all_loras"],
        )
        return
    t0 = time.monotonic()
    counts: list[int] = []
    ran = False
    try:
        max_tokens = int(worker.scheduler_config.max_num_batched_tokens)
        graph_max = _graphed_max(worker)
        counts = warm_token_counts(max_tokens, graph_max)
        lora_config = getattr(runner, "lora_config", None)
        active = lora_config.max_loras if lora_config is not None else 0
        marker = _marker(worker, counts, active)
        marked = marker is not None and warm_marker.is_marked(marker)
        if marked and not counts:
            log.info("moelora: model warm-up skipped: Triton's cache was warmed for this server (marker %s)", marker)
            return
        ran = True
        last = None
        for m in reversed(counts[-1:] if marked else counts):  # largest first: the allocator's pool is sized once
            last = runner._dummy_run(m, skip_eplb=True, remove_lora=False, num_active_loras=active)
        logits = _warm_logits(runner, last, active)
        if marked:
            log.info(
                "moelora: model warm-up skipped: Triton's cache was warmed for this server (marker %s); "
                "one pass of %d tokens and logits %s loaded its kernels in %.1f s",
                marker,
                counts[-1],
                logits,
                time.monotonic() - t0,
            )
            return
        log.info(
            "moelora: model warm-up ran %d token counts (%d..%d, %d LoRA slots), logits %s, in %.1f s",
            len(counts),
            counts[0] if counts else 0,
            counts[-1] if counts else 0,
            active,
            logits,
            time.monotonic() - t0,
        )
        if marker is not None:
            warm_marker.mark(marker)
    except Exception as exc:
        log.warning("moelora: model warm-up stopped: %r", exc)
        if _world_size() > 1:  # ...but a rank that stopped half-way would leave the others waiting in collectives
            raise
    finally:
        try:
            if ran:
                runner.maybe_remove_all_loras(getattr(runner, "lora_config", None))
        except Exception as exc:  # noqa: BLE001
            log.warning("moelora: removing the warm-up's dummy LoRAs failed: %r", exc)


def _marker(worker: Any, counts: list[int], active: int) -> str | None:
    """The warm-up's marker when a marked cache may let it be skipped: one process only (ranks that decided apart
    would wait on each other's collectives) and not `MOELORA_WARMUP=always`."""
    if os.environ.get(WARMUP_ENV) == "always" or _world_size() > 1:
        return None
    try:
        return warm_marker.digest(worker, counts, active)
    except Exception as exc:  # noqa: BLE001  (no marker: the warm-up runs, as it always did)
        log.info("moelora: no warm-up marker: %r", exc)
        return None


def _warm_logits(runner: Any, last: Any, active: int) -> str:
    """Logits once for the last dummy pass's sampled rows, its adapters still mapped, so an adapter with LoRA on
    lm_head has its shrink/expand compiled now (dense_warmup compiles every bucket on that first call) rather than
    under the first requests: the dummy passes stop at the hidden states, and vLLM's own sampler warm-up runs
    without adapters. Returns what was done, for the log line."""
    if active <= 0 or not isinstance(last, tuple) or len(last) != 2:
        return "skipped (no LoRA slots or no dummy pass)"
    model: Any = getattr(runner, "model", None)
    if getattr(runner, "is_pooling_model", False) or not hasattr(model, "compute_logits") or not _last_pp_rank():
        return "skipped (no logits on this rank)"
    import torch

    rows = last[1]
    with torch.inference_mode():
        model.compute_logits(torch.rand_like(rows))  # as vLLM's sampler warm-up: dummy states may hold inf/nan
    return f"computed for {rows.shape[0]} rows"


def _last_pp_rank() -> bool:
    """Only the last pipeline stage holds lm_head."""
    try:
        from vllm.distributed.parallel_state import get_pp_group

        return bool(get_pp_group().is_last_rank)
    except (ImportError, AssertionError):  # no parallel state set up: one process, which is the last stage
        return True


def _graphed_max(worker: Any) -> int:
    """The largest token count a mixed (prefill) batch is padded to a captured graph for; 0 when such batches run
    eagerly (enforce_eager, or graphs for decode-only batches): then every size above 0 can meet a new variant."""
    compilation = worker.vllm_config.compilation_config
    mode = getattr(compilation.cudagraph_mode, "name", str(compilation.cudagraph_mode))
    if worker.model_config.enforce_eager or mode not in ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE"):
        return 0
    return max(compilation.cudagraph_capture_sizes or [], default=0)


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def install_model_warmup(patches: Patches) -> str | None:
    """Wrap vLLM's kernel_warmup through `patches`; None when done, else why not (nothing changed).

    The wrapper goes into vllm.model_executor.warmup.kernel_warmup, so the GPU worker module binds it when it is
    imported later (`from ... import kernel_warmup`), and into that module too if it already is. The plugin is
    loaded in every vLLM process, the API server's included: the worker module itself is not imported from here."""
    import importlib
    import sys

    module = importlib.import_module("vllm.model_executor.warmup.kernel_warmup")
    original = getattr(module, "kernel_warmup", None)
    if original is None:
        return "vLLM has no kernel_warmup"
    if not KERNEL_WARMUP_PARAMETERS <= set(inspect.signature(original).parameters):
        return "vLLM's kernel_warmup takes no worker"
    if "kernel_warmup" in _original:
        return None

    def kernel_warmup(worker, *args, **kwargs):
        warm_model(worker)
        try:
            return original(worker, *args, **kwargs)
        finally:
            if getattr(getattr(worker, "model_config", None), "enforce_eager", False):
                startup_profile.stop()  # no graph capture follows: the start-up ends here

    kernel_warmup.__qualname__ = "moelora_kernel_warmup"
    _original["kernel_warmup"] = original
    patches.on_undo(_forget)
    patches.on_undo(lambda: _unbind_late(kernel_warmup, original))
    patches.set(module, "kernel_warmup", kernel_warmup)
    worker_module = sys.modules.get(WORKER_MODULE)
    if worker_module is not None and getattr(worker_module, "kernel_warmup", None) is original:
        patches.set(worker_module, "kernel_warmup", kernel_warmup)
    return None


def _forget() -> None:
    _original.pop("kernel_warmup", None)


def _unbind_late(ours: Callable[..., object], original: Callable[..., object]) -> None:
    """A worker module imported after install bound our wrapper by its own import, unrecorded: give it vLLM's."""
    import sys

    worker_module: Any = sys.modules.get(WORKER_MODULE)
    if worker_module is not None and getattr(worker_module, "kernel_warmup", None) is ours:
        worker_module.kernel_warmup = original
