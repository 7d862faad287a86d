"""A dense layer's LoRA at decode sizes with its shrink folded into the base GEMM (CUDA, `MOELORA_DENSE_FOLD`).

At start-up, once vLLM's LoRA manager has made its layers (`LoRAModelManager._create_lora_modules`), each linear
LoRA layer that qualifies gets one weight W' = [W; every slice's lora_a] ((N + R), K): the base layer's weight and
bias and vLLM's `lora_a_stacked` become views into it (the bias padded with R zeros), so vLLM's `set_lora` and
`reset_lora`, which copy into `lora_a_stacked` in place, keep W' current, and every other path (the base GEMM,
vLLM's LoRA kernels, dense_splitk) reads the same memory as before. The memory is the same: W and lora_a are freed.

A call on vLLM's LoRA stream (`dense_lora.apply_async`) with 1 <= M <= the window and an adapter in the batch is
then served on the current stream as one GEMM, x @ W'.T (the base output and every adapter's shrink), and one
`folded_expand` launch that writes the output: no second stream, fork, join or add. Other calls run as before.

A layer qualifies when the tensor-parallel size is 1, its base is unquantized (vLLM's `UnquantizedLinearMethod`,
whose GEMM is F.linear on CUDA, without batch-invariant mode), weights and adapters share one fp16/bf16 dtype,
vLLM's stacked lora_a are alike and contiguous, and every slice's width is a multiple of a column tile. Its kernel is
launched once at fold time on scratch rows, so it is compiled before any CUDA-graph capture. Why fold: a dense
layer's LoRA cost about half as much folded as on the second stream (docs/benchmarks.md, "A dense layer's LoRA beside
the base GEMM"); the GEMM reads R more rows at every size, so only decode sizes are served folded.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .patches import Patches

__all__ = ["ENV", "fold_layer", "install_dense_fold", "serve", "window"]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_DENSE_FOLD"  # the largest token count served folded (default: dense_lora's window); "0" folds nothing

_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Folded:
    """One folded layer: W', its padded bias (None without one), the base width N and the expand's tables."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    n: int
    layout: Any  # moelora.kernels.dense_config.DenseLayout
    max_loras: int
    block_n: int


_folded: dict[int, Folded] = {}  # id(layer) -> its fold
_original: dict[str, Callable[..., Any]] = {}
_window: list[int] = [0]


def window() -> int:
    """The largest token count served folded (0: none), read at install."""
    return _window[0]


def _block_n(widths: tuple[int, ...]) -> int | None:
    """The expand's column tile: 64 for several slices and 32 for one (the fastest measured beside the GEMM), smaller
    where a slice's width needs it; None where no tile of 16 or more divides every width."""
    for block_n in (64, 32, 16) if len(widths) > 1 else (32, 16):
        if all(w % block_n == 0 for w in widths):
            return block_n
    return None


def _why_not(layer: Any) -> str | None:
    """None when the layer can be folded, else why not (a short reason, counted in the start-up log)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from moelora.kernels.dense_config import layout_fits

    base = getattr(layer, "base_layer", None)
    if getattr(layer, "tp_size", None) != 1:
        return "tensor parallel"
    if type(getattr(base, "quant_method", None)) is not UnquantizedLinearMethod:
        return "quantized base"
    weight, bias = getattr(base, "weight", None), getattr(base, "bias", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or not weight.is_contiguous():
        return "weight layout"
    a: tuple[torch.Tensor, ...] = tuple(getattr(layer, "lora_a_stacked", ()))
    b: tuple[torch.Tensor, ...] = tuple(getattr(layer, "lora_b_stacked", ()))
    slices = tuple(getattr(layer, "output_slices", ()))
    if not (len(a) == len(b) == len(slices) >= 1) or sum(slices) != weight.shape[0]:
        return "slices"
    dtype, (n, k) = weight.dtype, weight.shape
    if dtype not in _DTYPES or any(t.dtype != dtype or t.device != weight.device for t in (*a, *b)):
        return "dtype"
    if bias is not None and (bias.shape != (n,) or bias.dtype != dtype or not bias.is_contiguous()):
        return "bias layout"
    # Rows of W': each lora_a whole (contiguous), of the weight's K; then the kernels' own layout rule.
    if a[0].ndim != 4 or a[0].shape[1] != 1 or a[0].shape[-1] != k or not all(t.is_contiguous() for t in a):
        return "lora_a layout"
    if not layout_fits(a, b, slices):
        return "lora layout"
    return None


def fold_layer(layer: Any, groups: int) -> str | None:
    """Fold one linear LoRA layer's lora_a into its base weight and compile its expand; None when done, else why not
    (then nothing changed). groups: the group count serving launches with (vLLM's default active-adapter count, the
    length of its id table), which the compile launch matches so that serving finds the same kernel variant."""
    from moelora.kernels.dense_config import dense_layout
    from moelora.kernels.dense_folded import fold_weight, folded_expand

    if (why := _why_not(layer)) is not None:
        return why
    if (block_n := _block_n(tuple(layer.output_slices))) is None:
        return "slice widths"
    base = layer.base_layer
    weight, bias = base.weight, base.bias
    (n, k), dev, dtype = weight.shape, weight.device, weight.dtype
    folded = fold_weight(weight.data, layer.lora_a_stacked)
    rows = [t.numel() // k for t in layer.lora_a_stacked]
    views = [v.view(t.shape) for v, t in zip(folded[n:].split(rows), layer.lora_a_stacked, strict=True)]
    padded = None
    if bias is not None:
        padded = torch.zeros(folded.shape[0], dtype=dtype, device=dev)
        padded[:n].copy_(bias.data)
        bias.data = padded[:n]
    weight.data = folded[:n]
    layer.lora_a_stacked = tuple(views)
    layout, max_loras = dense_layout(views, layer.lora_b_stacked), views[0].shape[0]
    # Compile now, outside any capture, on one scratch row in no group (tables as vLLM's: int32, no token counted).
    table = torch.zeros(groups + 1, dtype=torch.int32, device=dev)
    meta = (table[:1], table[:groups], table, torch.full((groups,), -1, dtype=torch.int32, device=dev), groups)
    scratch = torch.zeros(1, folded.shape[0], dtype=dtype, device=dev)
    folded_expand(
        torch.empty(1, n, dtype=dtype, device=dev), scratch, layout, meta, max_loras=max_loras, block_n=block_n
    )
    _folded[id(layer)] = Folded(folded, padded, n, layout, max_loras, block_n)
    return None


def serve(layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """The layer's output for this call, served folded, or None (nothing done) for the caller's path."""
    from moelora.kernels.dense_folded import folded_expand

    fold = _folded.get(id(layer))
    m = x.size(0)
    if fold is None or not 1 <= m <= window() or x.ndim != 2 or x.dtype != fold.weight.dtype:
        return None
    if bias is not None and (fold.bias is None or bias.data_ptr() != fold.bias.data_ptr()):
        return None  # a bias that is not the base layer's own
    wrapper = layer.punica_wrapper
    meta = wrapper.token_mapping_meta.meta_args(m, False)
    if bool(meta[5].item()):  # no adapter in this batch: the caller's path does only the base GEMM
        return None
    both = torch.nn.functional.linear(x, fold.weight, None if bias is None else fold.bias)
    out = torch.empty(m, fold.n, dtype=x.dtype, device=x.device)
    groups = int(meta[6].item())
    folded_expand(out, both, fold.layout, (*meta[1:5], groups), max_loras=fold.max_loras, block_n=fold.block_n)
    return out


def fold_modules(manager: Any) -> None:
    """Fold every linear LoRA layer of vLLM's LoRA manager that qualifies; log how many and why the others not."""
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    kept: Counter[str] = Counter()
    done = 0
    for module in manager.modules.values():
        if not isinstance(module, BaseLinearLayerWithLoRA) or not getattr(module, "_enable_aux_cuda_stream", False):
            continue
        groups = int(module.punica_wrapper.token_mapping_meta.meta_args(1, False)[6].item())
        try:
            why = fold_layer(module, groups)
        except Exception as exc:  # noqa: BLE001  (this layer keeps the second stream; the server starts)
            _folded.pop(id(module), None)
            why = f"{type(exc).__name__}: {exc}"
        if why is None:
            done += 1
        else:
            kept[why] += 1
    summary = dict(kept) or "none"
    log.info(
        "moelora: dense LoRA folded into the base GEMM at 1-%d tokens: %d layers; kept: %s", window(), done, summary
    )


def create_lora_modules(self: Any) -> None:
    """vLLM's `LoRAModelManager._create_lora_modules`, then the fold of its linear layers."""
    _original["create"](self)
    fold_modules(self)


def install_dense_fold(patches: Patches, *, apply_async_installed: bool) -> str | None:
    """Hook the LoRA manager's module creation through `patches`; None when done, else why not (nothing changed)."""
    from moelora.kernels.dense_config import MAX_SERVED_M

    raw = os.environ.get(ENV, str(MAX_SERVED_M)).strip()
    if not raw.isdigit():
        return f"{ENV}={raw!r} is not a token count"
    if int(raw) == 0:
        return f"{ENV}=0"
    if not apply_async_installed:
        return "dense_lora's LoRA-stream path is not installed"
    from vllm import envs
    from vllm.lora.model_manager import LoRAModelManager

    if envs.VLLM_BATCH_INVARIANT:
        return "batch-invariant mode keeps vLLM's own GEMM"
    fn = LoRAModelManager.__dict__.get("_create_lora_modules")
    if fn is None or tuple(inspect.signature(fn).parameters) != ("self",):
        return "LoRAModelManager._create_lora_modules is not the pinned one"
    _window[0] = int(raw)
    _original["create"] = fn
    patches.set(LoRAModelManager, "_create_lora_modules", create_lora_modules)
    patches.on_undo(_forget)
    return None


def _forget() -> None:
    _original.clear()
    _folded.clear()
    _window[0] = 0
