"""Each loaded adapter's weights in one pinned host buffer, instead of vLLM's pinned copy of every tensor (CUDA).

vLLM keeps loaded adapters in host memory, pinned, so that activating one is a fast asynchronous copy to the GPU. It
pins every tensor as it reads the file (`LoRAModel.from_lora_tensors`), then merges them (q/k/v into qkv_proj, a MoE
layer's per-expert pairs into stacked tensors) into new, unpinned tensors, and pins those again at the end of
`_create_merged_loras_inplace`. An adapter on every expert of a large MoE is tens of thousands of tensors: that is
tens of thousands of pinned allocations and two copies of every byte, and torch's host allocator rounds each
allocation up to a power of two. vLLM also keeps GPT-OSS's fused gate_up weights under two names and pins both.

Installed, both of vLLM's passes are off (its `PIN_MEMORY` flag, read when each pass runs, is False in the two
modules) and after vLLM's merge the adapter's final tensors are copied into one pinned buffer, whose views replace
them: one allocation and one copy per adapter, a tensor held under two names copied once. If that fails the tensors
stay as vLLM's merge left them (unpinned: activation is then a synchronous copy) and the load goes on.
`MOELORA_ADAPTER_PINNING=0` keeps vLLM's pinning.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

import torch

from .contract import MERGE_PARAMETERS
from .patches import Patches

__all__ = ["ENV", "MERGE_PARAMETERS", "install_adapter_pinning", "pack_into_one_buffer"]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_ADAPTER_PINNING"
# Each tensor starts on this boundary in the buffer: any dtype's view is aligned, and copies start on a cache line.
_ALIGN = 256

Slot = tuple[Any, Any]  # (a LoRA weights object or one of its lists, the attribute name or list index)


def _pinned_already(tensor: torch.Tensor) -> bool:
    return tensor.is_pinned()


def _unpinned(value: object) -> TypeGuard[torch.Tensor]:
    """A tensor to copy: on the CPU and not pinned (vLLM creates its warm-up dummies' weights pinned; those stay as
    they are, and only what its merge stacked from them is copied)."""
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and not _pinned_already(value)


def _slots(lora_model: Any) -> Iterator[tuple[Slot, torch.Tensor]]:
    """Every unpinned CPU tensor the adapter holds (lora_a and lora_b of each module, either a tensor or a list of
    them), with where it is held."""
    for weights in lora_model.loras.values():
        for name in ("lora_a", "lora_b"):
            value = getattr(weights, name, None)
            if isinstance(value, list):
                for index, tensor in enumerate(value):
                    if _unpinned(tensor):
                        yield (value, index), tensor
            elif _unpinned(value):
                yield (weights, name), value


def _key(tensor: torch.Tensor) -> tuple:
    """Two names hold the same tensor exactly when these agree (vLLM hands one object to several, or views alike)."""
    return (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def pack_into_one_buffer(lora_model: Any, allocate: Callable[[int], torch.Tensor]) -> tuple[int, int]:
    """Copy every unpinned CPU tensor of `lora_model` into one uint8 buffer from `allocate(nbytes)` and point the
    model at views of it; returns (bytes, tensors copied). All or nothing: the model changes only after every copy."""
    slots = [(slot, _key(tensor), tensor) for slot, tensor in _slots(lora_model)]
    offsets: dict[tuple, tuple[int, int, torch.Tensor]] = {}  # key -> (offset, bytes, tensor)
    size = 0
    for _, key, tensor in slots:
        if key not in offsets:
            nbytes = tensor.numel() * tensor.element_size()
            offsets[key] = (size, nbytes, tensor)
            size += _aligned(nbytes)
    if not offsets:
        return 0, 0
    buffer = allocate(size)
    views: dict[tuple, torch.Tensor] = {}
    for key, (offset, nbytes, tensor) in offsets.items():
        view = buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor)
        views[key] = view
    for (holder, where), key, _ in slots:
        if isinstance(holder, list):
            holder[where] = views[key]
        else:
            setattr(holder, where, views[key])
    return size, len(offsets)


def _pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _pin(lora_model: Any, allocate: Callable[[int], torch.Tensor]) -> None:
    t0 = time.monotonic()
    try:
        nbytes, count = pack_into_one_buffer(lora_model, allocate)
    except Exception as exc:  # noqa: BLE001  (an unpinned adapter still serves; a failed load would not)
        log.warning("moelora: adapter %s left unpinned: %r", getattr(lora_model, "id", "?"), exc)
        return
    if count == 0:
        return
    log.info(
        "moelora: adapter %s pinned in one buffer: %d tensors, %.3f GB, %.2f s",
        getattr(lora_model, "id", "?"),
        count,
        nbytes / 1e9,
        time.monotonic() - t0,
    )


def install_adapter_pinning(patches: Patches, allocate: Callable[[int], torch.Tensor] = _pinned) -> str | None:
    """Turn vLLM's two pinning passes off and pin each merged adapter in one buffer; None when done, else why not
    (nothing changed)."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    import vllm.lora.lora_model as lora_model_module
    import vllm.lora.model_manager as manager_module

    if not getattr(manager_module, "PIN_MEMORY", False):
        return "vLLM pins no host memory on this platform"
    if not hasattr(lora_model_module, "PIN_MEMORY"):
        return "vLLM's lora_model has no PIN_MEMORY"
    manager = getattr(manager_module, "LoRAModelManager", None)
    original = vars(manager).get("_create_merged_loras_inplace") if manager is not None else None
    if original is None:
        return "vLLM's LoRAModelManager has no _create_merged_loras_inplace"
    parameters = tuple(inspect.signature(original).parameters)
    if parameters != MERGE_PARAMETERS:
        return f"_create_merged_loras_inplace takes {parameters}"

    def _create_merged_loras_inplace(self, lora_model):
        original(self, lora_model)
        _pin(lora_model, allocate)

    _create_merged_loras_inplace.__qualname__ = "moelora_create_merged_loras_inplace"
    # host_adapters merges off the engine thread without pinning (no CUDA call there), and pins on it later.
    _create_merged_loras_inplace.moelora_unpinned = original  # type: ignore[attr-defined]
    _create_merged_loras_inplace.moelora_pin = lambda lora_model: _pin(lora_model, allocate)  # type: ignore[attr-defined]
    patches.set(lora_model_module, "PIN_MEMORY", False)
    patches.set(manager_module, "PIN_MEMORY", False)
    patches.set(manager, "_create_merged_loras_inplace", _create_merged_loras_inplace)
    return None
