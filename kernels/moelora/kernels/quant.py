"""Expert LoRA weights in int8: one adapter's A and B rounded per rank, and the scale the expand applies.

A (E, r, K) gets one scale per rank row (over K), B (E, N, r) one per rank column (over N). Both scales multiply the
same rank index of the intermediate, so the op needs only their product, (E, r) float32: the shrink reads int8 A
as integers, and the expand multiplies the summed intermediate by the product before it rounds it and multiplies
by int8 B. Symmetric, 127 levels: rounding moves each weight by at most half a step of its row's (column's) largest
magnitude over 127."""

from __future__ import annotations

import torch

__all__ = ["dequantize_expert_lora", "quantize_expert_lora"]

_LEVELS = 127


def quantize_expert_lora(lora_a: torch.Tensor, lora_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 A, int8 B, scale) for lora_a (..., r, K) and lora_b (..., N, r) of the same leading dims; scale is
    (..., r) float32 with A ~ int8 A * scale_a[..., :, None] and B ~ int8 B * scale_b[..., None, :] and scale =
    scale_a * scale_b. An all-zero rank (an empty slot) gets scale 0 and int8 zeros."""
    if lora_a.shape[:-2] != lora_b.shape[:-2] or lora_a.shape[-2] != lora_b.shape[-1]:
        raise ValueError(f"lora_a (..., r, K) and lora_b (..., N, r) disagree: {lora_a.shape}, {lora_b.shape}")
    a = lora_a.float()
    b = lora_b.float()
    scale_a = a.abs().amax(dim=-1) / _LEVELS
    scale_b = b.abs().amax(dim=-2) / _LEVELS
    # A zero scale divides by one instead: its row (column) is all zeros and stays so.
    qa = torch.round(a / torch.where(scale_a > 0, scale_a, 1.0).unsqueeze(-1)).clamp_(-_LEVELS, _LEVELS)
    qb = torch.round(b / torch.where(scale_b > 0, scale_b, 1.0).unsqueeze(-2)).clamp_(-_LEVELS, _LEVELS)
    return qa.to(torch.int8), qb.to(torch.int8), scale_a * scale_b


def dequantize_expert_lora(
    qa: torch.Tensor, qb: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights the op computes with on (int8 A, int8 B, scale): A's rows times the scales' product, B's
    integers; their LoRA is exactly the int8 op's, up to the op's own rounding of the intermediate."""
    return qa.to(dtype) * scale.to(dtype).unsqueeze(-1), qb.to(dtype)
