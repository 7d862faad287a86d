"""Which steps run the LoRA on vLLM's second CUDA stream: those of up to `max_tokens()` tokens (CUDA).

With `VLLM_LORA_ENABLE_DUAL_STREAM=1` (the operator sets it) vLLM runs each layer's LoRA on a second stream, beside
the base GEMM, into an output of its own that the main stream zero-fills first and adds after the join. That pays
at decode sizes, where both are small and the LoRA hides beside the base kernels. A step carrying prompt chunks has
thousands of tokens: its base GEMMs fill every SM, so the LoRA runs after them anyway, and the fill and the add are
two more passes over the layer's whole output (the prefill-step profiles in docs/benchmarks.md). Above the bound the
LoRA runs as vLLM runs it without the second stream: on the main stream, added straight into the layer's output.

MoE layers: `TritonExperts.apply` reads `lora_context.aux_stream` to choose; the wrapper hides the stream (and its
events) from a call with more tokens and puts them back after it. Dense layers: dense_lora.apply_async calls
`dense_in_place` and then vLLM's `_apply_sync`. `MOELORA_STREAM_MAX_TOKENS=N` moves the bound (0: never the second
stream); `MOELORA_DENSE_STREAM_MAX_TOKENS=N` moves the dense layers' bound alone (by default the same): a dense LoRA
in place at decode adds its one launch to the main stream but saves the fork's two events and the add.
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
    "DENSE_ENV",
    "ENV",
    "MAX_TOKENS",
    "dense_in_place",
    "dense_max_tokens",
    "in_place",
    "install_lora_stream",
    "max_tokens",
]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_STREAM_MAX_TOKENS"
DENSE_ENV = "MOELORA_DENSE_STREAM_MAX_TOKENS"
# Far above a decode batch (vLLM's captured sizes, up to 512 by default), below a prompt chunk of the sizes served.
MAX_TOKENS = 1024

_original: dict[str, Callable[..., Any]] = {}


def _bound(env: str, default: int) -> int:
    raw = os.environ.get(env, "")
    try:
        return max(0, int(raw)) if raw.strip() else default
    except ValueError:
        log.warning("moelora: %s=%r is not a whole number; the bound stays %d tokens", env, raw, default)
        return default


@functools.cache  # read once a process (install starts afresh): it is asked on every layer's call
def max_tokens() -> int:
    """The most tokens a step may have for its LoRA to run on the second stream."""
    return _bound(ENV, MAX_TOKENS)


@functools.cache
def dense_max_tokens() -> int:
    """The most tokens a step may have for a dense layer's LoRA to run on the second stream (max_tokens unless set)."""
    return _bound(DENSE_ENV, max_tokens())


def in_place(num_tokens: int) -> bool:
    """Whether a call of this many tokens runs its LoRA on the main stream, into the layer's output."""
    return num_tokens > max_tokens()


def dense_in_place(num_tokens: int) -> bool:
    """The same for a dense layer's call."""
    return num_tokens > dense_max_tokens()


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
    dense_max_tokens.cache_clear()
    _original["apply"] = fn
    patches.set(TritonExperts, "apply", experts_apply)
    patches.on_undo(_original.clear)
    return None
