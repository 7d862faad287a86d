"""The bundled H200 library: it covers the grid issue 5 asks for, and vLLM's own lookup and our default_config
return exactly its entries (no silent fallback to defaults)."""

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from moelora.kernels import KernelConfig, default_config
from moelora.kernels.routing import max_blocks_for
from moelora.kernels.tools.tune import MODEL_PRESETS

CONFIGS = Path(__file__).resolve().parents[2] / "kernels" / "moelora" / "kernels" / "configs"
OURS = CONFIGS / "NVIDIA_H200.json"
VLLM_DIR = CONFIGS / "NVIDIA_H200"
RANKS, MAX_LORAS, MS = (16, 32, 64), (1, 4, 8), (1, 16, 64, 256, 1024)
GRID = list(itertools.product(MODEL_PRESETS.values(), RANKS, MAX_LORAS, MS))


def _vllm_calls(shape):
    """(op, num_slices, inter key) of vLLM's calls for this model (w13: lora_b rows per slice)."""
    w13_inter = 2 * shape.inter // shape.w13_slices
    return [("w13", shape.w13_slices, w13_inter), ("w2", 1, shape.inter)]


def base_file(shape) -> str:
    """vLLM's base fused-MoE config file of a model (the experts' own GEMMs), as tune_moe names it."""
    return f"E={shape.experts},N={shape.inter},device_name=NVIDIA_H200.json"


@pytest.mark.parametrize("shape", list(MODEL_PRESETS.values()), ids=lambda s: s.name)
def test_vllms_own_lookup_reads_the_bundled_base_moe_files(shape, monkeypatch):
    """Every token count the base tuner covers is in the file, and vLLM's experts get exactly that entry for it
    (no "Using default MoE config")."""
    from vllm.model_executor.layers.fused_moe import fused_moe
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils

    from moelora.kernels.tools.tune_moe import DEFAULT_M, FIELDS

    tree = json.loads((VLLM_DIR / base_file(shape)).read_text())
    assert sorted(map(int, tree)) == sorted(DEFAULT_M)
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(VLLM_DIR))
    monkeypatch.setattr(current_platform, "get_device_name", lambda *a, **k: "NVIDIA H200", raising=False)
    platform_utils.get_device_name_as_file_name.cache_clear()
    fused_moe.get_moe_configs.cache_clear()
    try:
        for m, leaf in tree.items():
            assert set(leaf) == set(FIELDS), m
            w1, w2 = (shape.experts, 2 * shape.inter, shape.hidden), (shape.experts, shape.hidden, shape.inter)
            assert fused_moe.try_get_optimal_moe_config(w1, w2, shape.top_k, None, int(m)) == leaf
    finally:
        fused_moe.get_moe_configs.cache_clear()
        platform_utils.get_device_name_as_file_name.cache_clear()


def test_vllm_files_cover_the_grid():
    files = {p.name: json.loads(p.read_text()) for p in VLLM_DIR.glob("*.json")}
    assert sorted(files) == sorted(
        [f"NVIDIA_H200_FUSED_MOE_LORA_{op}_{part}.json" for op in ("W13", "W2") for part in ("SHRINK", "EXPAND")]
        + ["NVIDIA_H200_SHRINK.json", "NVIDIA_H200_EXPAND_FALSE.json", "NVIDIA_H200_EXPAND_TRUE.json"]
        + [base_file(shape) for shape in MODEL_PRESETS.values()]
    )
    missing = []
    for shape, rank, loras, m in GRID:
        for op, slices, inter in _vllm_calls(shape):
            for part in ("SHRINK", "EXPAND"):
                tree = files[f"NVIDIA_H200_FUSED_MOE_LORA_{op.upper()}_{part}.json"]
                try:
                    tree[str(loras)][str(slices)][str(m)][str(rank)][str(shape.hidden)][str(inter)]
                except KeyError:
                    missing.append((shape.name, op, part, rank, loras, m))
    assert not missing, missing[:5]


def test_vllms_own_lookup_returns_the_bundled_leaves(vllm_lookup):
    with vllm_lookup(VLLM_DIR) as vllm_utils:
        for shape in MODEL_PRESETS.values():
            for op, slices, inter in _vllm_calls(shape):
                for part in ("shrink", "expand"):
                    tree = json.loads(
                        (VLLM_DIR / f"NVIDIA_H200_FUSED_MOE_LORA_{op.upper()}_{part.upper()}.json").read_text()
                    )
                    want = tree["8"][str(slices)]["16"]["32"][str(shape.hidden)][str(inter)]
                    got = vllm_utils.get_lora_op_configs(
                        op_type=f"fused_moe_lora_{op}_{part}",
                        max_loras=8,
                        batch=16,
                        hidden_size=shape.hidden,
                        rank=32,
                        num_slices=slices,
                        moe_intermediate_size=inter,
                    )
                    assert got == want


@pytest.mark.parametrize("shape", MODEL_PRESETS.values(), ids=lambda s: s.name)
def test_our_table_covers_the_grid_and_default_config_reads_it(shape):
    entries = json.loads(OURS.read_text())["entries"]
    by_key = {
        (e["k"], e["n"], e["num_experts"], e["rank"], e["max_loras"], e["m"], e.get("route", "grouped")): e["config"]
        for e in entries
    }
    # The tuner calls our op once per vLLM slice, as the plugin does (Qwen3's w13: two calls of N = inter).
    ops = {"w13": (shape.hidden, 2 * shape.inter // shape.w13_slices), "w2": (shape.inter, shape.hidden)}
    for (_, rank, loras, m), (k, n) in itertools.product([g for g in GRID if g[0] is shape], ops.values()):
        cfg = by_key.get((k, n, shape.experts, rank, loras, m, "grouped"))
        assert cfg is not None, (shape.name, k, n, rank, loras, m)
        assert default_config(
            routing=table_routing(shape, loras, m, direct=False),
            k=k,
            n=n,
            rank=rank,
            device=torch.device("cpu"),
            config_file=OURS,
        ) == KernelConfig(**cfg)
    # Entries tuned with direct routing are read for direct routing only.
    direct = [e for e in entries if e.get("route") == "direct" and e["num_experts"] == shape.experts]
    assert direct
    for e in direct:
        assert default_config(
            routing=table_routing(shape, e["max_loras"], e["m"], direct=True),
            k=e["k"],
            n=e["n"],
            rank=e["rank"],
            device=torch.device("cpu"),
            config_file=OURS,
        ) == KernelConfig(**e["config"])
        grouped = by_key[(e["k"], e["n"], e["num_experts"], e["rank"], e["max_loras"], e["m"], "grouped")]
        assert default_config(
            routing=table_routing(shape, e["max_loras"], e["m"], direct=False),
            k=e["k"],
            n=e["n"],
            rank=e["rank"],
            device=torch.device("cpu"),
            config_file=OURS,
        ) == KernelConfig(**grouped)


def table_routing(shape, loras, m, *, direct):
    """The fields of a MoeLoraRouting that the table lookup reads."""
    return SimpleNamespace(
        num_pairs=m * shape.top_k,
        top_k=shape.top_k,
        num_experts=shape.experts,
        max_loras=loras,
        max_blocks=max_blocks_for(m * shape.top_k, loras * shape.experts, 16),
        direct=direct,
    )


# The dense files (tune_dense.py) cover GPT-OSS-20B's attention and router projections at rank 32 and 8 adapters.
DENSE = [
    ("shrink", 3, 2880, 32),
    ("shrink", 1, 4096, 32),
    ("shrink", 1, 2880, 32),  # qkv, o, router: k, n
    ("expand", 3, 32, 4096),
    ("expand", 1, 32, 2880),
    ("expand", 1, 32, 32),
]


# The expand runs with add_inputs=False under vLLM's dual LoRA stream (what the operator deploys), True without it.
DENSE_LOOKUPS = [
    (*case, add_inputs) for case in DENSE for add_inputs in ((None,) if case[0] == "shrink" else (False, True))
]


@pytest.mark.parametrize("op, slices, k, n, add_inputs", DENSE_LOOKUPS)
def test_vllms_own_lookup_reads_the_dense_files(op, slices, k, n, add_inputs, vllm_lookup):
    name = "NVIDIA_H200_SHRINK.json" if op == "shrink" else f"NVIDIA_H200_EXPAND_{str(add_inputs).upper()}.json"
    tree = json.loads((VLLM_DIR / name).read_text())
    with vllm_lookup(VLLM_DIR) as vllm_utils:
        for m in (1, 16, 64, 1024):
            want = tree["9"][str(slices)][str(m)][str(k)][str(n)]  # vLLM keys max_loras as its id table's length, 8 + 1
            # hidden_size/rank as the ops pass them: the shrink's K and rank, the expand's widest slice and rank
            hidden, rank = (k, n) if op == "shrink" else (n, k)
            got = vllm_utils.get_lora_op_configs(
                op_type=op,
                max_loras=9,
                batch=m,
                hidden_size=hidden,
                rank=rank,
                num_slices=slices,
                add_inputs=add_inputs,
            )
            assert got == want
            assert {"block_m", "block_n", "block_k", "num_warps", "num_ctas", "num_stages"} <= set(got)


def test_table_token_counts_are_the_bundled_buckets(monkeypatch):
    from moelora.kernels import launch_config, table_token_counts

    assert table_token_counts(torch.device("cpu")) == ()  # no table off CUDA
    monkeypatch.setattr(launch_config, "_config_file", lambda device: OURS)
    counts = table_token_counts(torch.device("cpu"))
    assert counts == tuple(sorted({e["m"] for e in json.loads(OURS.read_text())["entries"]}))
    assert {1, 16, 64, 256, 1024} <= set(counts)
