"""Which steps run the LoRA on vLLM's second CUDA stream: those of up to `max_tokens()` tokens (CUDA).

With `VLLM_LORA_ENABLE_DUAL_STREAM=1` (the operator sets it) vLLM runs each layer's LoRA on a second stream, beside
the base GEMM, into an output of its own that the main stream zero-fills first and adds after the join. That pays
at decode sizes, where both are small and the LoRA hides beside the base kernels. A step carrying prompt chunks has
thousands of tokens: its base GEMMs fill every SM, so the LoRA runs after them anyway, and the fill and the add are
two more passes over the layer's whole output (the prefill-step profiles in docs/benchmarks.md). Above the bound the
LoRA runs as vLLM runs it without the second stream: on the main stream, added straight into the layer's output.

MoE layers: `TritonExperts.apply` reads `lora_context.aux_stream` to choose; the wrapper hides the stream (and its
events) from a call with more tokens and puts them back after it. Dense layers: dense_lora.apply_async calls
`in_place` and then vLLM's `_apply_sync`. `MOELORA_STREAM_MAX_TOKENS=N` moves the bound (0: never the second stream).

The stream's priority: vLLM makes its LoRA stream at the default priority, so the block scheduler hands SMs freed
by a base kernel to the base and LoRA kernels alike. At decode sizes the LoRA is the longer path of a dense layer's
fork (several dependent launches against one GEMM), so the main stream waits at the join for LoRA kernels that
started late. `install_stream_priority` has vLLM make the stream at the GPU's highest priority instead (a CUDA graph
captured on it keeps the priority on its kernel nodes); `MOELORA_LORA_STREAM_PRIORITY=normal` keeps vLLM's.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from .contract import EXPERTS_APPLY_PARAMETERS
from .patches import Patches

__all__ = [
    "ENV",
    "MAX_TOKENS",
    "PRIORITY_ENV",
    "in_place",
    "install_lora_stream",
    "install_stream_priority",
    "max_tokens",
    "new_stream",
]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_STREAM_MAX_TOKENS"
PRIORITY_ENV = "MOELORA_LORA_STREAM_PRIORITY"
# The modules of vLLM that bind its LoRA-stream getter by name: a replacement must reach each of them.
_GETTER = "_get_lora_aux_cuda_stream"
_GETTER_USERS = ("vllm.lora.layers.base_linear", "vllm.lora.layers.fused_moe")
# Far above a decode batch (vLLM's captured sizes, up to 512 by default), below a prompt chunk of the sizes served.
MAX_TOKENS = 1024

_original: dict[str, Callable[..., Any]] = {}


@functools.cache  # read once a process (install starts afresh): it is asked on every layer's call
def max_tokens() -> int:
    """The most tokens a step may have for its LoRA to run on the second stream."""
    raw = os.environ.get(ENV, "")
    try:
        return max(0, int(raw)) if raw.strip() else MAX_TOKENS
    except ValueError:
        log.warning("moelora: %s=%r is not a whole number; the bound stays %d tokens", ENV, raw, MAX_TOKENS)
        return MAX_TOKENS


def in_place(num_tokens: int) -> bool:
    """Whether a call of this many tokens runs its LoRA on the main stream, into the layer's output."""
    return num_tokens > max_tokens()


def experts_apply(self: Any, output: Any, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
    """vLLM's `TritonExperts.apply`, with the LoRA's second stream hidden from calls above the bound."""
    context = getattr(self, "_lora_context", None)
    if context is None or context.aux_stream is None or not in_place(hidden_states.size(0)):
        return _original["apply"](self, output, hidden_states, *args, **kwargs)
    stream, events = context.aux_stream, context.events
    context.aux_stream = context.events = None  # the object the modular kernel filled for this forward, as it is
    try:
        return _original["apply"](self, output, hidden_states, *args, **kwargs)
    finally:
        context.aux_stream, context.events = stream, events


def install_lora_stream(patches: Patches) -> str | None:
    """Wrap TritonExperts.apply through `patches`; None when done, else why not (nothing changed)."""
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    fn = TritonExperts.__dict__.get("apply")
    if fn is None or tuple(inspect.signature(fn).parameters) != EXPERTS_APPLY_PARAMETERS:
        return "TritonExperts.apply is not the pinned one"
    max_tokens.cache_clear()
    _original["apply"] = fn
    patches.set(TritonExperts, "apply", experts_apply)
    patches.on_undo(_original.clear)
    return None


def new_stream() -> Any:
    """A CUDA stream at the current device's highest priority (the lowest number of torch's range)."""
    import torch

    greatest = torch.cuda.Stream.priority_range()[1]  # type: ignore[call-arg]  # static; torch's stub says otherwise
    return torch.cuda.Stream(priority=greatest)


def install_stream_priority(patches: Patches) -> str | None:
    """Have vLLM make its LoRA stream with `new_stream`, through `patches`; None when done, else why not (nothing
    changed). The stream is still made where and when vLLM makes it: on first use, only with the dual stream on."""
    import importlib

    from vllm.lora.layers import utils

    choice = os.environ.get(PRIORITY_ENV, "high").strip().lower()
    if choice != "high":
        return f"{PRIORITY_ENV}={choice}"
    original = utils.__dict__.get(_GETTER)
    users = [importlib.import_module(name) for name in _GETTER_USERS]
    if original is None or any(vars(module).get(_GETTER) is not original for module in users):
        return f"vLLM's {_GETTER} is not bound where it was read"
    if utils._lora_aux_cuda_stream is not None:
        return "vLLM's LoRA stream was made before the plugin loaded"

    def lora_aux_stream() -> Any:
        if (
            utils._lora_aux_cuda_stream is None
            and utils.envs.VLLM_LORA_ENABLE_DUAL_STREAM
            and utils.current_platform.is_cuda_alike()
        ):
            utils._lora_aux_cuda_stream = stream = new_stream()
            log.info("moelora: vLLM's LoRA stream made at priority %d, the device's highest", stream.priority)
        return original()

    for module in (utils, *users):
        patches.set(module, _GETTER, lora_aux_stream)
    return None
