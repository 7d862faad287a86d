"""vLLM's blocked MoE-LoRA routing turned back into each pair's expert (topk_ids), in one Triton launch plus the -1
fill: the same computation in torch ops takes a dozen small launches per op call (the vLLM plugin uses this on CUDA,
and its torch version, moelora.vllm_plugin.layout, on the CPU and as this kernel's test oracle)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["topk_ids_from_blocks"]

_BLOCK = 1024


@triton.jit(do_not_specialize=["num_pairs", "width"])
def _scatter_block_experts_kernel(
    # pointers
    sorted_ptr,  # (slots, width) int32 pair ids per adapter slot, padding = num_pairs
    expert_ptr,  # (slots, num_blocks) int32 expert of each block
    npad_ptr,  # (slots,) int32 used length of each row (garbage for slots without tokens)
    lora_ptr,  # (M,) int adapter slot of each token, -1 none
    out_ptr,  # (num_pairs,) int32, -1 on entry; out: expert of each pair
    # sizes
    num_pairs,
    width,
    top_k,
    # strides
    stride_sl,
    stride_el,
    # meta
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
):
    slot = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    used = tl.load(npad_ptr + slot)
    in_row = (offs < width) & (offs < used)
    pair = tl.load(sorted_ptr + slot * stride_sl + offs, mask=in_row, other=-1)
    valid = in_row & (pair >= 0) & (pair < num_pairs)
    owner = tl.load(lora_ptr + pair // top_k, mask=valid, other=-1).to(tl.int32)
    valid = valid & (owner == slot)
    expert = tl.load(expert_ptr + slot * stride_el + offs // BLOCK_M, mask=valid, other=-1)
    tl.store(out_ptr + pair, expert, mask=valid)


def topk_ids_from_blocks(
    *,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    num_tokens: int,
    top_k: int,
    block_m: int,
) -> torch.Tensor:
    """(num_tokens, top_k) int32 expert of each pair p = t * top_k + k, -1 for pairs not found.

    sorted_token_ids: (slots, width) int32, per adapter slot the pair ids grouped by expert in blocks of block_m,
    padded with num_tokens * top_k; expert_ids: (slots, >= width / block_m) int32, each block's expert;
    num_tokens_post_padded: (slots,) int32, the used length of each row (rows of slots without tokens may hold
    anything); token_lora_mapping: (num_tokens,) adapter slot of each token, -1 none. An entry counts only below its
    row's length, when it names a real pair whose token maps to that row's slot."""
    if sorted_token_ids.dim() != 2 or expert_ids.dim() != 2 or expert_ids.shape[0] != sorted_token_ids.shape[0]:
        raise ValueError(
            f"sorted_token_ids (slots, width) and expert_ids (slots, blocks) expected, got "
            f"{tuple(sorted_token_ids.shape)} and {tuple(expert_ids.shape)}"
        )
    slots, width = sorted_token_ids.shape
    if expert_ids.shape[1] * block_m < width:
        raise ValueError(f"expert_ids {tuple(expert_ids.shape)} does not cover {width} entries in blocks of {block_m}")
    if num_tokens_post_padded.shape != (slots,) or token_lora_mapping.shape[0] < num_tokens:
        raise ValueError("num_tokens_post_padded must be (slots,) and token_lora_mapping cover num_tokens tokens")
    if sorted_token_ids.stride(1) != 1 or expert_ids.stride(1) != 1:
        raise ValueError("sorted_token_ids and expert_ids need contiguous rows")
    num_pairs = num_tokens * top_k
    out = torch.full((num_pairs,), -1, dtype=torch.int32, device=sorted_token_ids.device)
    if num_pairs == 0:
        return out.view(num_tokens, top_k)
    grid = (slots, triton.cdiv(width, _BLOCK))
    _scatter_block_experts_kernel[grid](
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        token_lora_mapping,
        out,
        num_pairs,
        width,
        top_k,
        sorted_token_ids.stride(0),
        expert_ids.stride(0),
        BLOCK_M=block_m,
        BLOCK=_BLOCK,
    )
    return out.view(num_tokens, top_k)
