"""A dense layer's LoRA in one launch (CUDA): vLLM's `PunicaWrapperGPU.add_lora_linear` through moelora's
`dense_splitk` where that is faster, vLLM's own buffer, `lora_shrink` and `lora_expand` everywhere else.

`add_lora_linear` is the one call of both of vLLM's paths for a linear layer's LoRA: `_apply_lora_to_output` (one
stream: add into the layer's output) and `_apply_async_impl` (vLLM's second LoRA stream: `add_inputs=False` writes
a zeroed output of its own). The rule, `route`, is decided from what is known before CUDA-graph capture:
- the token count is in `served_config`'s window (2 <= M <= 64 on the H200 table; M = 1 and M > 64 stay vLLM's);
- the call is the plain one (no `buffer`, no keyword but `add_inputs`), 2-D, same fp16/bf16 dtype throughout,
  last dimensions contiguous, the slices' widths those of `lora_b`, and not traced by torch.compile (so the
  one-stream path is routed only where the model runs eagerly; the second-stream path, the served one, is inside
  vLLM's opaque `lora_linear_async` op and is routed under torch.compile and CUDA graphs);
- the layer has been prepared: on its first eager call with an adapter in the batch (vLLM's profile run has none;
  the plugin's model warm-up, or any served batch, has), outside capture, its weight tables are made and each
  config it may launch is compiled at the largest M and group count, which gives how many programs the GPU holds;
  a layer never prepared (first met inside capture) stays vLLM's: with `MOELORA_WARMUP=0` there is no model
  warm-up, so graphs captured before any batch with adapters keep vLLM's kernels;
- the grid for this M and group count fits in that room (an arithmetic check; `dense_splitk` raising ValueError
  anyway also falls back, before anything is launched).
`MOELORA_DENSE_SPLITK=0` keeps vLLM's kernels for every call; `MOELORA_DENSE_SPLITK_CONFIGS` replaces the served
launch parameters (`dense_config.parse_served`'s format), so that a device call can compare tables end to end.

On vLLM's LoRA stream (`VLLM_LORA_ENABLE_DUAL_STREAM=1`, as the operator deploys it) vLLM zero-fills the LoRA's
output before computing into it, because its expand leaves rows without an adapter unwritten. dense_splitk writes
every row (zeros where there is no adapter, and past the tokens grouped in a batch padded to a graph's size), so
`BaseLinearLayerWithLoRA._apply_async_impl` is replaced by the same fork and join (`apply_async`) whose output is
filled only when the route does not take the call: the fill was a launch on the LoRA stream's critical path, two per
layer and decode step.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import dense_fold
from .contract import ADD_LORA_LINEAR_PARAMETERS, APPLY_ASYNC_PARAMETERS, APPLY_SYNC_PARAMETERS, PARALLEL_PARAMETERS
from .lora_stream import dense_in_place
from .patches import Patches

__all__ = ["CONFIGS_ENV", "ENV", "apply_async", "install_dense_lora", "route"]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_DENSE_SPLITK"  # "0": vLLM's dense LoRA kernels for every call
CONFIGS_ENV = "MOELORA_DENSE_SPLITK_CONFIGS"

_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class _Layer:
    """One layer's prepared state: its weight tables, the epilogues prepared (`add` values) and, per (config, add),
    how many programs the GPU holds."""

    layout: Any  # moelora.kernels.dense_config.DenseLayout
    slices: int
    prepared: set[bool] = field(default_factory=set)
    rooms: dict[tuple[Any, bool], int] = field(default_factory=dict)


_layers: dict[tuple, _Layer | None] = {}  # None: this layer's weights do not fit the kernel (vLLM's, always)
_original: dict[str, Callable[..., Any]] = {}
_logged: set[tuple] = set()
_served: dict[str, Any] = {}  # the table served (dense_config.Served), read at install


def _weights_key(lora_a: Sequence[torch.Tensor], lora_b: Sequence[torch.Tensor]) -> tuple:
    return tuple((w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype) for w in (*lora_a, *lora_b))


def _supported(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    output_slices: Sequence[int],
) -> bool:
    """The call is one dense_splitk computes as vLLM does (checked on every call: cheap, and views change)."""
    if x.ndim != 2 or y.ndim != 2 or y.size(0) != x.size(0) or x.stride(-1) != 1 or y.stride(-1) != 1:
        return False
    if not (len(lora_a) == len(lora_b) == len(output_slices) >= 1) or y.size(1) != sum(output_slices):
        return False
    dtype = x.dtype
    if dtype not in _DTYPES or y.dtype != dtype or any(w.dtype != dtype for w in (*lora_a, *lora_b)):
        return False
    return x.device == y.device == lora_a[0].device


def _prepare(layer: _Layer, x: torch.Tensor, max_loras: int, add: bool) -> None:
    """Compile each config the layer may launch with this `add` at the largest M and group count, on scratch
    buffers, and record its room (the counter words grow to that grid now). Outside capture only."""
    from moelora.kernels.dense_config import MAX_SERVED_M, SERVED, served_configs
    from moelora.kernels.dense_splitk import splitk_prepare

    from .dense_warmup import _meta

    t0 = time.monotonic()
    dev, m = x.device, MAX_SERVED_M
    args = _meta(max_loras, m, dev)
    meta = (args[1], args[2], args[3], args[4], int(args[6].item()))
    width = sum(layer.layout.widths)
    scratch_x = torch.zeros(m, layer.layout.k, device=dev, dtype=x.dtype)
    scratch_y = torch.zeros(m, width, device=dev, dtype=x.dtype)
    for config in served_configs(layer.slices, _served or SERVED):
        layer.rooms[(config, add)] = splitk_prepare(scratch_y, scratch_x, layer.layout, meta, add=add, config=config)
    layer.prepared.add(add)
    shape = (layer.layout.k, width, layer.slices, add)
    if shape not in _logged:  # once per shape: the first layer of a shape compiles, the others find it compiled
        _logged.add(shape)
        rooms = [layer.rooms[(c, add)] for c in served_configs(layer.slices, _served or SERVED)]
        log.info(
            "moelora: dense LoRA in one launch ready for K=%d, N=%d (%d slices), add=%s: rooms %s, in %.2f s",
            *shape,
            rooms,
            time.monotonic() - t0,
        )


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def route(
    wrapper: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    add: bool,
) -> bool:
    """Run this add_lora_linear call as dense_splitk and return True, or return False (nothing done) for vLLM's."""
    from moelora.kernels.dense_config import (
        MAX_SERVED_M,
        SERVED,
        dense_layout,
        layout_fits,
        served_config,
        served_kwargs,
        splitk_programs,
    )
    from moelora.kernels.dense_splitk import dense_splitk

    if not _supported(y, x, lora_a, lora_b, output_slices):
        return False
    m = x.size(0)
    meta_args = wrapper.token_mapping_meta.meta_args(m, wrapper.lora_config.specialize_active_lora)
    if bool(meta_args[5].item()):  # no adapter in this batch: vLLM's ops return at once
        return False
    key = _weights_key(lora_a, lora_b)
    if not _capturing(x.device):
        if key not in _layers:
            fits = layout_fits(lora_a, lora_b, output_slices)
            _layers[key] = _Layer(dense_layout(lora_a, lora_b), len(lora_a)) if fits else None
        layer = _layers[key]
        # Above lora_stream's dense bound the LoRA is added in place; with the window below the bound, such a call's
        # epilogue is never served, so it prepares nothing (asked last: only a layer not yet prepared asks).
        never = dense_in_place(m) and not dense_in_place(MAX_SERVED_M)
        if layer is not None and add not in layer.prepared and not never:
            _prepare(layer, x, meta_args[4].numel() - 1, add)
    layer = _layers.get(key)
    config = served_config(m, len(output_slices), _served or SERVED)
    if layer is None or config is None or (config, add) not in layer.rooms:
        return False
    groups = int(meta_args[6].item())
    programs, _ = splitk_programs(m=m, groups=groups, slices=layer.slices, k=layer.layout.k, config=config)
    if programs > layer.rooms[(config, add)]:
        return False
    meta = (meta_args[1], meta_args[2], meta_args[3], meta_args[4], groups)
    try:
        dense_splitk(y, x, layer.layout, meta, scale=scale, add=add, **served_kwargs(config))
    except ValueError:  # raised before launching: the grid does not fit (a variant the room was not taken for)
        return False
    return True


def add_lora_linear(
    self: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    scale: float,
    output_slices: tuple[int, ...],
    *,
    buffer: torch.Tensor | None = None,
    **kwargs: Any,
) -> None:
    """vLLM's PunicaWrapperGPU.add_lora_linear, through dense_splitk where `route` takes it. Not while torch.compile
    traces the call (vLLM's one-stream path inside a compiled model: the route's host-side decisions cannot be
    traced); vLLM's second-stream path calls it inside vLLM's own opaque op, `lora_linear_async`, so it is routed."""
    if not torch.compiler.is_compiling() and buffer is None and set(kwargs) <= {"add_inputs"}:
        add = bool(kwargs.get("add_inputs", True))
        if route(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, add):
            return None
    return _original["add_lora_linear"](
        self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs
    )


def apply_async(self: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """vLLM's `BaseLinearLayerWithLoRA._apply_async_impl`: the base layer on the current stream, the LoRA on vLLM's
    LoRA stream into an output of its own, that output added once both are done; the output is left unfilled where
    `route` takes the call (dense_splitk writes every row, rows past the tokens vLLM grouped included). A 3-D input
    (the transformers backend) and `specialize_active_lora` (graphs per adapter count, whose group count a replay may
    outgrow) stay vLLM's, filled. A layer dense_fold folded is served on the current stream at decode sizes. Above
    lora_stream's dense bound the LoRA runs as without the second stream (`_apply_sync`: added into the base output
    on the current stream)."""
    if x.ndim != 2 or getattr(getattr(self.punica_wrapper, "lora_config", None), "specialize_active_lora", True):
        return _original["apply_async"](self, x, bias)
    if (folded := dense_fold.serve(self, x, bias)) is not None:
        return folded
    if "apply_sync" in _original and dense_in_place(x.size(0)):
        return self._apply_sync(x, bias)
    wrapper, a, b, slices = self.punica_wrapper, self.lora_a_stacked, self.lora_b_stacked, self.output_slices

    def base() -> torch.Tensor:
        return self._get_quant_method().apply(self.base_layer, x, bias)

    def lora() -> torch.Tensor:
        delta = torch.empty((x.size(0), sum(slices)), device=self.device, dtype=x.dtype)
        if not route(wrapper, delta, x, a, b, 1.0, slices, False):
            delta.zero_()  # vLLM's kernels leave rows without an adapter unwritten
            _original["add_lora_linear"](wrapper, delta, x, a, b, 1.0, slices, add_inputs=False)
        return delta

    output, delta = _original["fork"](base, lora, self._events[0], self._events[1], self._lora_stream)
    output.add_(delta)
    return output


def install_dense_lora(cls: type, patches: Patches) -> str | None:
    """Hook cls.add_lora_linear (PunicaWrapperGPU) through `patches`; None when done, else why not (nothing
    changed)."""
    fn = cls.__dict__.get("add_lora_linear")
    if fn is None:
        return f"{cls.__name__} has no add_lora_linear"
    params = inspect.signature(fn).parameters.values()
    named = tuple(p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD)
    if named != ADD_LORA_LINEAR_PARAMETERS or not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return f"{cls.__name__}.add_lora_linear signature differs from the pinned one"
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    import moelora.kernels.dense_splitk  # noqa: F401  (fail here, at start-up, rather than on the first request)
    from moelora.kernels.dense_config import SERVED, parse_served

    _served.update(SERVED)
    if raw := os.environ.get(CONFIGS_ENV, "").strip():
        try:
            _served.update(parse_served(raw))
            log.info("moelora: dense LoRA launch parameters from %s: %s", CONFIGS_ENV, raw)
        except ValueError as e:
            log.warning("moelora: %s ignored, the built-in table served: %s", CONFIGS_ENV, e)
    _original["add_lora_linear"] = fn
    patches.set(cls, "add_lora_linear", add_lora_linear)
    patches.on_undo(_forget)
    _install_apply_async(patches)
    return None


def _install_apply_async(patches: Patches) -> None:
    """Replace vLLM's LoRA-stream fork for linear layers when it is the pinned one; otherwise keep it (its fill)."""
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
    from vllm.utils import multi_stream_utils

    fn = BaseLinearLayerWithLoRA.__dict__.get("_apply_async_impl")
    fork = getattr(multi_stream_utils, "maybe_execute_in_parallel", None)
    if (
        fn is None
        or fork is None
        or tuple(inspect.signature(fn).parameters) != APPLY_ASYNC_PARAMETERS
        or tuple(inspect.signature(fork).parameters) != PARALLEL_PARAMETERS
    ):
        log.info("moelora: vLLM's LoRA-stream fork for linear layers is not the pinned one: its output fill stays")
        return
    _original["apply_async"], _original["fork"] = fn, fork  # the fork checked here, not imported on every call
    sync = BaseLinearLayerWithLoRA.__dict__.get("_apply_sync")
    if sync is not None and tuple(inspect.signature(sync).parameters) == APPLY_SYNC_PARAMETERS:
        _original["apply_sync"] = sync  # a mark that it is pinned: apply_async calls the layer's own, overrides kept
    else:
        log.info("moelora: vLLM's LoRA path without the second stream is not the pinned one: every size forks")
    patches.set(BaseLinearLayerWithLoRA, "_apply_async_impl", apply_async)


def _forget() -> None:
    _original.clear()
    _served.clear()
    _layers.clear()
    _logged.clear()
