"""The blocked-routing inversion of layout.py as one Triton launch (plus the -1 fill): on the GPU the torch version
is a dozen small launches per op, each a few microseconds inside a CUDA graph, 48 ops per decode step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["topk_ids_from_blocks_triton"]

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


def topk_ids_from_blocks_triton(
    *,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    num_tokens: int,
    top_k: int,
    block_m: int,
) -> torch.Tensor:
    """Same contract as layout.topk_ids_from_blocks_torch."""
    slots, width = sorted_token_ids.shape
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
