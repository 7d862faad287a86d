"""From vLLM's routing arguments back to the one thing our kernels need: each pair's expert, `topk_ids` (M, top_k).

vLLM hands its fused MoE-LoRA op the routing in one of two forms (punica_gpu.add_lora_w13, 0.26, 0.32 and 0.33 alike):
- naive (few tokens): `sorted_token_ids is None` and `expert_ids` is topk_ids flattened, (M * top_k,);
- blocked: per adapter slot l, `sorted_token_ids[l]` lists pair ids p = t * top_k + k grouped by expert in blocks of
  block_m (padding entries hold P = M * top_k), `expert_ids[l, b]` is block b's expert and `num_tokens_post_padded[l]`
  the used length. Rows of slots without tokens in this batch are never written (uninitialised memory), so an entry
  counts only if it lies below that row's length, names a real pair, and that pair's token maps to slot l.
Every pair with an adapter appears exactly once, in its adapter's row, so scattering the block experts back to the
pair ids restores topk_ids for those pairs; pairs without an adapter stay -1, which our routing drops anyway.
"""

from __future__ import annotations

import torch

__all__ = ["topk_ids_from_blocks_torch", "topk_ids_from_vllm"]


def topk_ids_from_vllm(
    *,
    sorted_token_ids: torch.Tensor | None,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor | None,
    token_lora_mapping: torch.Tensor,
    num_tokens: int,
    top_k: int,
    block_m: int,
) -> torch.Tensor:
    """(M, top_k) expert ids (int32, -1 where unknown) from vLLM's arguments, without host synchronisation."""
    if sorted_token_ids is None:
        return expert_ids.view(num_tokens, top_k)
    if num_tokens_post_padded is None:
        raise ValueError("blocked routing needs num_tokens_post_padded")
    if expert_ids.shape[0] != sorted_token_ids.shape[0] or expert_ids.shape[1] * block_m < sorted_token_ids.shape[1]:
        raise ValueError(
            f"expert_ids {tuple(expert_ids.shape)} does not cover sorted_token_ids "
            f"{tuple(sorted_token_ids.shape)} in blocks of {block_m}"
        )
    if sorted_token_ids.is_cuda:
        from moelora.kernels import topk_ids_from_blocks

        return topk_ids_from_blocks(
            sorted_token_ids=sorted_token_ids,
            expert_ids=expert_ids,
            num_tokens_post_padded=num_tokens_post_padded,
            token_lora_mapping=token_lora_mapping,
            num_tokens=num_tokens,
            top_k=top_k,
            block_m=block_m,
        )
    return topk_ids_from_blocks_torch(
        sorted_token_ids=sorted_token_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=num_tokens_post_padded,
        token_lora_mapping=token_lora_mapping,
        num_tokens=num_tokens,
        top_k=top_k,
        block_m=block_m,
    )


def topk_ids_from_blocks_torch(
    *,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    num_tokens: int,
    top_k: int,
    block_m: int,
) -> torch.Tensor:
    """The blocked form in plain torch ops (the CPU path, and the oracle of moelora.kernels.topk_ids_from_blocks)."""
    slots, width = sorted_token_ids.shape
    num_pairs = num_tokens * top_k
    dev = sorted_token_ids.device
    pos = torch.arange(width, device=dev)
    pairs = sorted_token_ids.long()
    valid = (pos[None, :] < num_tokens_post_padded.long()[:, None]) & (pairs >= 0) & (pairs < num_pairs)
    safe = torch.where(valid, pairs, 0)
    slot_of_pair = token_lora_mapping.long()[safe // top_k]
    valid &= slot_of_pair == torch.arange(slots, device=dev)[:, None]
    block_expert = expert_ids.long()[:, pos // block_m]
    out = torch.full((num_pairs + 1,), -1, dtype=torch.int32, device=dev)
    # Invalid entries all land on the spare slot num_pairs, which is cut off.
    out.scatter_(0, torch.where(valid, pairs, num_pairs).view(-1), block_expert.to(torch.int32).view(-1))
    return out[:num_pairs].view(num_tokens, top_k)
