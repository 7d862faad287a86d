"""Whether to use programmatic dependent launch."""

from __future__ import annotations

import functools
import os

import torch


def use_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (SM90+): a kernel's CTAs start while the previous kernel drains, and the
    expand prefetches its B tile before waiting on the shrink. MOELORA_DISABLE_PDL=1 turns it off."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("MOELORA_DISABLE_PDL"):
        return False
    return _capability(device.index) >= (9, 0)


@functools.lru_cache(maxsize=16)
def _capability(index: int | None) -> tuple[int, int]:
    """Once per device: asked for every op and every routing, on every eager forward."""
    return torch.cuda.get_device_capability(index)
