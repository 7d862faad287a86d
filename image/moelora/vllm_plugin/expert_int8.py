"""The experts' LoRA weights in int8 (`MOELORA_EXPERT_LORA_WEIGHTS=int8`, the ModelServer's
spec.kernels.expertLoraWeights): a decode step reads half the bytes for its adapters.

vLLM keeps each MoE layer's adapter slots in the model's dtype and writes an adapter into its slot in set_lora (or
zeros it in reset_lora). Each MoE LoRA layer here gets, when vLLM creates its slots, an int8 copy of every slot with
one scale per rank (moelora.kernels.quant), allocated once so that CUDA graphs keep its addresses; after vLLM's own
set_lora or reset_lora the layer's slot is rounded into the copy, on the same stream. The op (triton_path.run_triton)
swaps a layer's stacked weights for their copy, found by the address of vLLM's first A slice. vLLM's own slots stay
(its code still writes them); the copy adds half their memory, inside what vLLM's start-up profile counts.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from moelora.kernels import quantize_expert_lora

from .contract import MOE_CREATE_PARAMETERS, MOE_RESET_LORA_PARAMETERS, MOE_SET_LORA_PARAMETERS
from .patches import Patches

__all__ = ["ENV", "install_expert_int8", "int8_weights"]

ENV = "MOELORA_EXPERT_LORA_WEIGHTS"
SLOT_PARAMETERS = {"set_lora": MOE_SET_LORA_PARAMETERS, "reset_lora": MOE_RESET_LORA_PARAMETERS}
log = logging.getLogger("vllm.moelora_plugin")


@dataclass(frozen=True)
class _Copy:
    """One op's int8 slots: A and B per slice, shaped as vLLM's, and the scales' product (slices, L, E, r)."""

    source_a: tuple[torch.Tensor, ...]
    source_b: tuple[torch.Tensor, ...]
    a: tuple[torch.Tensor, ...]
    b: tuple[torch.Tensor, ...]
    scale: torch.Tensor

    def requantize(self, index: int) -> None:
        for s, (src_a, src_b) in enumerate(zip(self.source_a, self.source_b, strict=True)):
            qa, qb, scale = quantize_expert_lora(src_a[index], src_b[index])
            self.a[s][index].copy_(qa)
            self.b[s][index].copy_(qb)
            self.scale[s, index].copy_(scale)


_copies: dict[int, _Copy] = {}  # by the data_ptr of vLLM's slice-0 A of the op
_original: dict[type, Any] = {}


def int8_weights(
    lora_a: tuple[torch.Tensor, ...], lora_b: tuple[torch.Tensor, ...]
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor | None]:
    """The int8 copy of these stacked weights and its scales, or the weights themselves and None."""
    copy = _copies.get(lora_a[0].data_ptr()) if lora_a and lora_a[0].dtype != torch.int8 else None
    if (
        copy is None
        or len(copy.a) != len(lora_a)
        or copy.source_a[0].shape != lora_a[0].shape
        or copy.source_b[0].data_ptr() != lora_b[0].data_ptr()
    ):
        return lora_a, lora_b, None
    return copy.a, copy.b, copy.scale


def _ops(layer: Any) -> list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    return [
        (tuple(layer.w13_lora_a_stacked), tuple(layer.w13_lora_b_stacked)),
        (tuple(layer.w2_lora_a_stacked[:1]), tuple(layer.w2_lora_b_stacked[:1])),
    ]


def add_copies(layer: Any) -> str | None:
    """Give a MoE LoRA layer its int8 copies and quantize after its slot writes; None when done, else why not (the
    layer keeps serving its own weights)."""
    if getattr(layer, "_moelora_int8", False):  # a subclass's creation that called its base's: copies made once
        return None
    ops = _ops(layer)
    for a, b in ops:
        if a[0].dim() != 4 or b[0].dim() != 4 or a[0].shape[:2] != b[0].shape[:2] or a[0].shape[2] != b[0].shape[3]:
            return f"stacked {tuple(a[0].shape)} and {tuple(b[0].shape)} are not (L, E, r, K) and (L, E, N, r)"
        if a[0].stride(1) == 0:
            return "LoRA A shared across experts"
    copies = []
    for a, b in ops:
        copies.append(
            _Copy(
                source_a=a,
                source_b=b,
                a=tuple(torch.zeros_like(t, dtype=torch.int8) for t in a),
                b=tuple(torch.zeros_like(t, dtype=torch.int8) for t in b),
                scale=torch.zeros((len(a), *a[0].shape[:3]), dtype=torch.float32, device=a[0].device),
            )
        )
    if not _copies:
        size = sum(t.numel() for c in copies for t in (*c.a, *c.b)) / 2**20
        log.info("moelora: MoE LoRA adapter slots served from int8 copies (%.0f MiB a layer)", size)
    for copy in copies:
        _copies[copy.source_a[0].data_ptr()] = copy
    inside = [False]  # vLLM's set_lora may call reset_lora first: round the slot once, after the outer call
    for name in SLOT_PARAMETERS:
        vllms = getattr(layer, name)

        def written(*args: Any, _vllms: Any = vllms, **kwargs: Any) -> Any:
            if inside[0]:
                return _vllms(*args, **kwargs)
            inside[0] = True
            try:
                result = _vllms(*args, **kwargs)
            finally:
                inside[0] = False
            index = kwargs["index"] if "index" in kwargs else args[0]
            for copy in copies:
                copy.requantize(index)
            return result

        setattr(layer, name, written)  # this layer only: a subclass's set_lora calling its base's runs once
    layer._moelora_int8 = True
    return None


def _create_lora_weights(cls: type) -> Any:
    def create_lora_weights(self: Any, max_loras: int, lora_config: Any, model_config: Any = None) -> None:
        _original[cls](self, max_loras, lora_config, model_config)
        why = add_copies(self)
        if why is not None:
            log.warning("moelora: a MoE LoRA layer keeps its adapters in %s: %s", lora_config.lora_dtype, why)

    return create_lora_weights


def install_expert_int8(patches: Patches) -> str | None:
    """Hook the MoE LoRA layers' slot creation through `patches` when MOELORA_EXPERT_LORA_WEIGHTS=int8; None when
    done, else why not (nothing changed)."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice in ("", "model"):
        return f"{ENV} is not int8"
    if choice != "int8":
        return f"{ENV}={choice!r} is not model or int8"
    from vllm.lora.layers import fused_moe

    classes = [c for c in (fused_moe.FusedMoEWithLoRA, getattr(fused_moe, "FusedMoE3DWithLoRA", None)) if c]
    for cls in classes:
        fn = cls.__dict__.get("create_lora_weights")
        if fn is None or tuple(inspect.signature(fn).parameters) != MOE_CREATE_PARAMETERS:
            return f"{cls.__name__}.create_lora_weights is not the pinned one"
        for name, want in SLOT_PARAMETERS.items():
            slot_fn = getattr(cls, name, None)
            if slot_fn is None or tuple(inspect.signature(slot_fn).parameters) != want:
                return f"{cls.__name__}.{name} is not the pinned one"
    for cls in classes:
        _original[cls] = cls.__dict__["create_lora_weights"]
        patches.set(cls, "create_lora_weights", _create_lora_weights(cls))
    patches.on_undo(_forget)
    return None


def _forget() -> None:
    _original.clear()
    _copies.clear()
