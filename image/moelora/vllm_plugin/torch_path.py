"""The MoE-LoRA op in vectorised torch: the CPU path (vLLM has none: its MoE-LoRA backend is Triton-only).

Same contract as moelora.kernels.fused_moe_lora, from topk_ids instead of a GPU routing: for every pair (t, k) whose
token has an adapter a >= 0 and whose expert e is in range, output[t, k] += w * (x_row @ A[a, e].T) @ B[a, e].T, with
the rank intermediate rounded to the weights' dtype as vLLM's kernels do, and w the routed weight when asked.
Pairs are grouped by (adapter, expert) so each weight slice is read once and the work is dense matmuls.
"""

from __future__ import annotations

import torch

__all__ = ["moe_lora_torch"]


def moe_lora_torch(
    *,
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    topk_ids: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    mul_routed_weight: bool = False,
) -> None:
    """Add the contribution into output (M, top_k, N) in place. x: (M, K) shared by the slots, or (M, top_k, K)."""
    m, top_k = topk_ids.shape
    max_loras, num_experts, _, k = lora_a.shape
    n = lora_b.shape[2]
    if output.shape != (m, top_k, n):
        raise ValueError(f"output must be {(m, top_k, n)}, got {tuple(output.shape)}")
    if mul_routed_weight and (topk_weights is None or topk_weights.shape != (m, top_k)):
        raise ValueError("mul_routed_weight needs topk_weights of shape (M, top_k)")
    rows = x.reshape(-1, k)
    per_pair = rows.shape[0] == m * top_k and x.dim() == 3
    adapter = token_lora_mapping.long()[:, None].expand(m, top_k).reshape(-1)
    expert = topk_ids.long().reshape(-1)
    valid = (adapter >= 0) & (adapter < max_loras) & (expert >= 0) & (expert < num_experts)
    pairs = torch.nonzero(valid).view(-1)
    if pairs.numel() == 0:
        return
    group = adapter[pairs] * num_experts + expert[pairs]
    group, order = torch.sort(group, stable=True)
    pairs = pairs[order]
    groups, counts = torch.unique_consecutive(group, return_counts=True)
    flat_out = output.flatten(0, 1)  # a view: w13's slices are column views of a wider output
    weights = topk_weights.reshape(-1) if mul_routed_weight and topk_weights is not None else None
    start = 0
    for g, c in zip(groups.tolist(), counts.tolist()):
        idx = pairs[start : start + c]
        start += c
        a, e = divmod(g, num_experts)
        xin = rows[idx] if per_pair else rows[idx // top_k]
        inter = (xin.float() @ lora_a[a, e].float().T).to(lora_b.dtype)
        delta = inter.float() @ lora_b[a, e].float().T
        if weights is not None:
            delta = delta * weights[idx].float()[:, None]
        flat_out[idx] = (flat_out[idx].float() + delta).to(output.dtype)
