"""Stand-ins for moelora.kernels' bundled kernel configs, in vLLM's and moelora's layouts, for the operator's tests."""

from __future__ import annotations

import json
import pathlib

GPT_OSS, QWEN3 = "openai/gpt-oss-20b", "Qwen/Qwen3-30B-A3B"
# (hidden, moe_intermediate, experts); moelora's table holds (k, n, experts) of each op: gate_up (hidden, 2 x inter)
# or per slice (hidden, inter), down (inter, hidden).
SHAPES = {GPT_OSS: (2880, 2880, 32), QWEN3: (2048, 768, 128)}
TABLE_KEYS = {
    GPT_OSS: {(2880, 5760, 32), (2880, 2880, 32)},
    QWEN3: {(2048, 1536, 128), (2048, 768, 128), (768, 2048, 128)},
}
LEAF = {"block_m": 16, "block_n": 32, "block_k": 32, "group_size_m": 8, "num_warps": 4, "num_stages": 3, "split_k": 1}
VLLM_FILES = (
    "NVIDIA_H200_FUSED_MOE_LORA_W13_SHRINK.json",
    "NVIDIA_H200_FUSED_MOE_LORA_W2_SHRINK.json",
    "NVIDIA_H200_FUSED_MOE_LORA_W2_EXPAND.json",
)
# vLLM's dense LoRA ops (attention and router projections): data[max_loras+1][num_slices][m][k][n] -> leaf, keyed by
# sizes a MoE shape does not carry, so mounted whole, for the model whose hidden size they were tuned with.
DENSE_FILES = ("NVIDIA_H200_SHRINK.json", "NVIDIA_H200_EXPAND_FALSE.json", "NVIDIA_H200_EXPAND_TRUE.json")


def vllm_tree(*leaves: tuple[int, int, int]) -> dict:
    """vLLM's nesting data[max_loras][num_slices][m][rank][hidden][inter], for leaves (num_slices, hidden, inter)."""
    tree: dict = {}
    for slices, hidden, inter in leaves:
        for max_loras, m in (("1", "1"), ("4", "64")):
            node = tree
            for key in (max_loras, str(slices), m, "16", str(hidden)):
                node = node.setdefault(key, {})
            node[str(inter)] = dict(LEAF)
    return tree


def dense_tree(k: int, n: int) -> dict:
    """vLLM's dense-op nesting data[max_loras+1][num_slices][m][k][n], for one (k, n) and a few m."""
    return {
        "5": {"1": {m: {str(k): {str(n): dict(LEAF)}} for m in ("1", "64")}, "3": {"1": {str(k): {str(n): dict(LEAF)}}}}
    }


def table_entry(k: int, n: int, experts: int, **config: object) -> dict:
    return {
        "k": k,
        "n": n,
        "rank": 16,
        "num_experts": experts,
        "max_loras": 1,
        "m": 1,
        "config": {"split_k": 1, **config},
    }


def vllm_leaves(tree: dict) -> list[tuple[str, ...]]:
    """The key paths of every leaf, checking the file is nested exactly like vLLM's: six levels of integer keys."""
    paths = []

    def walk(node: object, path: tuple[str, ...]) -> None:
        if len(path) == 6:
            assert isinstance(node, dict) and set(node) == set(LEAF), path
            paths.append(path)
            return
        assert isinstance(node, dict) and node, path  # no empty branch left behind
        for key, child in node.items():
            assert key.isdigit(), path
            walk(child, (*path, key))

    walk(tree, ())
    return paths


def write_bundle(root: pathlib.Path) -> pathlib.Path:
    """A small stand-in for moelora.kernels' bundled configs/ under `root`: GPT-OSS-20B and Qwen3-30B-A3B on the
    H200, with files in neither format and entries of shapes no known model has."""
    table = {
        "device": "NVIDIA H200",
        "source": "test",
        "entries": [table_entry(*key) for model in (GPT_OSS, QWEN3) for key in sorted(TABLE_KEYS[model])]
        + [table_entry(2880, 5760, 128)],
    }  # GPT-OSS' sizes with another expert count: no one's here
    (root / "NVIDIA_H200.json").write_text(json.dumps(table))
    gpu = root / "NVIDIA_H200"
    gpu.mkdir()
    w13, w2_shrink, w2_expand = VLLM_FILES
    (gpu / w13).write_text(json.dumps(vllm_tree((1, 2880, 5760), (2, 2048, 768))))
    # (4096, 2880): another model with GPT-OSS' intermediate size, of a hidden size no one here has.
    (gpu / w2_shrink).write_text(json.dumps(vllm_tree((1, 2880, 2880), (1, 2048, 768), (1, 4096, 2880))))
    (gpu / w2_expand).write_text(json.dumps(vllm_tree((1, 2048, 768))))  # tuned for Qwen3 only
    shrink, *expands = DENSE_FILES
    (gpu / shrink).write_text(json.dumps(dense_tree(2880, 16)))
    for expand in expands:
        (gpu / expand).write_text(json.dumps(dense_tree(16, 2880)))  # o_proj's output: GPT-OSS' hidden size
    (gpu / "README.txt").write_text("not a config")
    return root
