"""Naive PyTorch reference of the MoE-LoRA computation (the tests' oracle; never used on a hot path).

Layouts are vLLM's stacked ones:
    lora_a: (max_loras, E, r, K)    lora_b: (max_loras, E, N, r)
For every token t routed to expert e = topk_ids[t, k] and using adapter a = token_lora_mapping[t] (a = -1: none),
    output[t, k, :] += scale * ((x_row @ lora_a[a, e].T) @ lora_b[a, e].T)
where x_row is x[t] (x of shape (M, K), the gate_up input shared by the top-k slots) or x[t, k] (x of shape
(M, top_k, K), the down-projection input, one row per slot), and scale is topk_weights[t, k] when
mul_routed_weight (vLLM applies it to the down projection) else 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["moe_lora_layer_reference", "moe_lora_reference"]


def moe_lora_reference(
    *,
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor | Sequence[torch.Tensor],
    lora_b: torch.Tensor | Sequence[torch.Tensor],
    topk_ids: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    mul_routed_weight: bool = False,
) -> torch.Tensor:
    """Return output + the LoRA contribution, computed in float64 (output itself is not modified).

    output (M, top_k, N); x (M, K) or (M, top_k, K); topk_ids (M, top_k) int; token_lora_mapping (M,) int;
    topk_weights (M, top_k) float, needed when mul_routed_weight. lora_a and lora_b may be sequences of slices
    (vLLM's w13 for Qwen3-MoE): slice s then adds into output columns [s * N, (s + 1) * N), N its lora_b's width.
    """
    if not isinstance(lora_a, torch.Tensor):
        n = lora_b[0].shape[2]
        common = {
            "x": x,
            "topk_ids": topk_ids,
            "token_lora_mapping": token_lora_mapping,
            "topk_weights": topk_weights,
            "mul_routed_weight": mul_routed_weight,
        }
        parts = [
            moe_lora_reference(output=output[:, :, s * n : (s + 1) * n], lora_a=a, lora_b=b, **common)
            for s, (a, b) in enumerate(zip(lora_a, lora_b, strict=True))
        ]
        return torch.cat(parts, dim=2)
    m, top_k = topk_ids.shape
    max_loras, num_experts = lora_a.shape[:2]
    result = output.detach().to(torch.float64).clone()
    a64 = lora_a.detach().to(torch.float64)
    b64 = lora_b.detach().to(torch.float64)
    x64 = x.detach().to(torch.float64)
    for t in range(m):
        adapter = int(token_lora_mapping[t])
        if adapter < 0 or adapter >= max_loras:
            continue
        for k in range(top_k):
            expert = int(topk_ids[t, k])
            if expert < 0 or expert >= num_experts:
                continue
            row = x64[t] if x.dim() == 2 else x64[t, k]
            delta = (row @ a64[adapter, expert].T) @ b64[adapter, expert].T
            if mul_routed_weight:
                assert topk_weights is not None
                delta = delta * float(topk_weights[t, k])
            result[t, k] += delta
    return result


def moe_lora_layer_reference(
    *,
    gate_up_out: torch.Tensor,
    down_out: torch.Tensor,
    hidden: torch.Tensor,
    down_in: torch.Tensor,
    w13_a: torch.Tensor | Sequence[torch.Tensor],
    w13_b: torch.Tensor | Sequence[torch.Tensor],
    w2_a: torch.Tensor,
    w2_b: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    token_lora_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both LoRA ops of one MoE layer as vLLM applies them: gate_up (no routed weight) and down (routed weight).

    gate_up_out (M, top_k, 2I) and down_out (M, top_k, H) are the base outputs; hidden (M, H); down_in (M, top_k, I);
    w13_a and w13_b one slice or a sequence of slices (Qwen3-MoE: gate, up).
    Returns the two float64 results.
    """
    common = {"topk_ids": topk_ids, "token_lora_mapping": token_lora_mapping, "topk_weights": topk_weights}
    gate_up = moe_lora_reference(output=gate_up_out, x=hidden, lora_a=w13_a, lora_b=w13_b, **common)
    down = moe_lora_reference(output=down_out, x=down_in, lora_a=w2_a, lora_b=w2_b, mul_routed_weight=True, **common)
    return gate_up, down
