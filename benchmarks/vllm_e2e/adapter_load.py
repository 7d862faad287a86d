"""Loading adapters into vLLM's host cache, with vLLM's pinning and with the plugin's (one pinned buffer per adapter).

    PYTHONPATH=image:$SITE python3 benchmarks/vllm_e2e/adapter_load.py ADAPTERS_DIR [--count 8]

ADAPTERS_DIR holds lora1..loraN (make_qwen3.py's or the kit's make_loras.py's). Each mode runs in a fresh process
(torch's host allocator keeps what it pinned) and loads `count` adapters one after another, keeping each, as vLLM's
CPU cache does with --max-cpu-loras: vLLM's own reading (`LoRAModel.from_local_checkpoint`, device "cpu", bf16),
the merge its manager makes for these modules (q/k/v into qkv_proj with its `PackedLoRALayerWeights.pack`; a
per-expert adapter's experts with `pack_moe`), then the manager's own `_create_merged_loras_inplace` (it folds the
scalings, splits GPT-OSS's fused experts per expert for stand-ins of its 3D MoE layers, and runs its pinning pass;
installed, the plugin's wrapper replaces that pass). Then every
tensor of the last adapter is copied to the GPU, as an activation does. A third run repeats the plugin's with
torch's host allocator set to register its blocks from 8 threads (RUNS). Prints one table; needs CUDA for pinning
(on a CPU no run pins anything).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")
ATTENTION = re.compile(r"^(.*\.self_attn)\.(q_proj|k_proj|v_proj|o_proj)$")
PROJECTIONS = ("gate_proj", "down_proj", "up_proj")  # vLLM's packed order for an expert
# (mode, PYTORCH_CUDA_ALLOC_CONF): the last asks torch's host allocator to pin a malloc'd block with
# cudaHostRegister from 8 threads instead of one cudaHostAlloc, which may page-lock one large buffer faster.
RUNS = (
    ("vllm", ""),
    ("moelora", ""),
    ("moelora", "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"),
)


def expected_modules(adapter: pathlib.Path) -> set[str]:
    from safetensors import safe_open
    from vllm.lora.utils import parse_fine_tuned_lora_name

    names = {"qkv_proj", "experts"}
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as f:
        for key in f.keys():
            module, _ = parse_fine_tuned_lora_name(key)
            if m := EXPERT.match(module):
                names.add(f"experts.{m.group(2)}.{m.group(3)}")
            else:
                names.add(module.rsplit(".", 1)[-1])
    return names


def merge(model) -> None:
    from vllm.lora.lora_weights import PackedLoRALayerWeights

    layers: dict[str, set[int]] = {}
    attention: set[str] = set()
    for name in model.loras:
        if m := EXPERT.match(name):
            layers.setdefault(m.group(1), set()).add(int(m.group(2)))
        elif m := ATTENTION.match(name):
            attention.add(m.group(1))
    for prefix in sorted(attention):
        names = [f"{prefix}.{n}" for n in ("q_proj", "k_proj", "v_proj")]
        if all(n in model.loras for n in names):
            model.loras[f"{prefix}.qkv_proj"] = PackedLoRALayerWeights.pack([model.loras.pop(n) for n in names])
    for prefix, experts in sorted(layers.items()):
        names = [f"{prefix}.{e}.{p}" for e in sorted(experts) for p in PROJECTIONS]
        model.loras[prefix] = PackedLoRALayerWeights.pack_moe([model.loras.pop(n) for n in names], prefix)


def fused_experts(model) -> dict:
    """GPT-OSS's fused experts (`X.mlp.experts` beside `X.mlp.experts.base_layer`), as vLLM's 3D MoE LoRA layers
    whose expert count the manager's `_stack_moe_lora_weights` reads; {} for other adapters."""
    import torch
    from vllm.lora.layers import FusedMoE3DWithLoRA

    class Layer(FusedMoE3DWithLoRA):
        global_num_experts = 0  # vLLM's properties read the model's config; these layers have none
        ep_rank = 0

        def __init__(self, experts: int) -> None:
            torch.nn.Module.__init__(self)
            self.w13_lora_a_stacked = [torch.empty(1, experts, 1, 1)]
            self.global_num_experts = experts

    out = {}
    for name, weights in model.loras.items():
        if f"{name}.base_layer" in model.loras:
            out[name] = Layer(weights.lora_a.shape[0] // weights.rank)
    return out


def tensors(model) -> list:
    out = []
    for weights in model.loras.values():
        for value in (weights.lora_a, weights.lora_b):
            out += [t for t in (value if isinstance(value, list) else [value]) if t is not None]
    return out


def run_mode(mode: str, root: pathlib.Path, count: int) -> dict:
    import torch
    import vllm.lora.model_manager as manager_module
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    result: dict = {"mode": mode, "cuda": torch.cuda.is_available()}
    if mode == "moelora":
        from moelora.vllm_plugin.adapter_pinning import install_adapter_pinning
        from moelora.vllm_plugin.patches import Patches

        result["install"] = install_adapter_pinning(Patches()) or "on"
    if torch.cuda.is_available():
        torch.cuda.init()
    manager = object.__new__(manager_module.LRUCacheLoRAModelManager)
    manager.packed_modules, manager.modules, manager._is_3d_moe_model = {}, {}, True
    manager.is_pooling_model = manager._enable_mixed_moe_lora_format = manager._enable_moe_shared_loras = False
    kept, phases = [], []
    expected = expected_modules(root / "lora1")
    for i in range(1, count + 1):
        adapter = root / f"lora{i}"
        helper = PEFTHelper.from_local_dir(str(adapter), max_position_embeddings=None)
        t0 = time.perf_counter()
        model = LoRAModel.from_local_checkpoint(
            str(adapter), expected, helper, lora_model_id=i, device="cpu", dtype=torch.bfloat16
        )
        t1 = time.perf_counter()
        merge(model)
        if i == 1:
            manager.modules = fused_experts(model)
        t2 = time.perf_counter()
        manager._create_merged_loras_inplace(model)
        t3 = time.perf_counter()
        phases.append((t1 - t0, t2 - t1, t3 - t2))
        kept.append(model)
    last = tensors(kept[-1])
    result["phases"] = phases
    result["tensors"] = len(last)
    result["bytes"] = sum(t.numel() * t.element_size() for t in last)
    result["pinned"] = sum(t.is_pinned() for t in last)
    if torch.cuda.is_available():
        host_stats = getattr(torch.cuda, "host_memory_stats", None)  # torch 2.6 on
        stats = host_stats() if host_stats is not None else {}
        result["host_allocs"] = stats.get("num_host_alloc", 0)
        result["host_bytes"] = stats.get("allocated_bytes.all.current", stats.get("allocated_bytes.current", 0))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        copies = [t.to("cuda", non_blocking=True) for t in last]
        torch.cuda.synchronize()
        result["h2d_s"] = time.perf_counter() - t0
        del copies
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--mode", choices=("vllm", "moelora"), help=argparse.SUPPRESS)  # one mode, in this process
    args = p.parse_args(argv)
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.dir, args.count)))
        return 0
    rows = []
    for mode, alloc_conf in RUNS:
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else None
        out = subprocess.run(
            [sys.executable, __file__, str(args.dir), "--count", str(args.count), "--mode", mode],
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return out.returncode
        rows.append({**json.loads(out.stdout.strip().splitlines()[-1]), "alloc_conf": alloc_conf})
    size = f"{rows[0]['tensors']} tensors, {rows[0]['bytes'] / 1e9:.2f} GB"
    print(f"{size} per adapter after the merge; CUDA: {rows[0]['cuda']}")
    print(
        "| pinning | first adapter: read / merge / pin s | each later adapter (mean) s | "
        "pinned tensors | host allocations | pinned host GB | last adapter to GPU s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        first = r["phases"][0]
        later = r["phases"][1:] or r["phases"]
        mean = sum(sum(ph) for ph in later) / len(later)
        label = r["mode"] + (f" ({r['install']})" if r.get("install") not in (None, "on") else "")
        label += f", `{r['alloc_conf']}`" if r["alloc_conf"] else ""
        print(
            f"| {label} | {first[0]:.2f} / {first[1]:.2f} / {first[2]:.2f} | {mean:.2f} | "
            f"{r['pinned']} of {r['tensors']} | {r.get('host_allocs', '-')} | "
            f"{r.get('host_bytes', 0) / 1e9:.2f} | {r.get('h2d_s', float('nan')):.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
