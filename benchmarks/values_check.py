"""The agent's value check (every weight finite and bounded) on an adapter the size of a Qwen3-30B-A3B rank-32 one.

    .venv/bin/python benchmarks/values_check.py [--dir /tmp] [--layers 48] [--runs 3] [--keep]

Writes a bf16 safetensors file in vLLM's per-expert layout (48 layers x 128 experts x gate/up/down, plus attention:
36,864 + 384 tensors, 3.4 GB at rank 32), then times, on one core (the process pinned to one CPU):
reading the file alone, `values.check` on it, and the agent's whole `validate` (header, tensors against the base
model, values), each with a cold page cache (the file's pages dropped with posix_fadvise) and a warm one. Prints a
Markdown table, then deletes the file.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np

from moelora.agent.check import safetensors_header, values
from moelora.agent.check.safetensors_stream import TensorSpec, write
from moelora.agent.check.validate import Limits, validate

# Qwen3-30B-A3B's config.json (the fields the agent reads).
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "num_experts": 128,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
}
BASE = "Qwen/Qwen3-30B-A3B"
RANK = 32


def specs(layers: int) -> list[TensorSpec]:
    """Every lora_A/lora_B of attention and of each expert, in vLLM's per-expert layout, sorted by name."""
    hidden, inter, experts = 2048, 768, 128
    heads, kv_heads, head_dim = 32, 4, 128
    modules = {
        "self_attn.q_proj": (hidden, heads * head_dim),
        "self_attn.k_proj": (hidden, kv_heads * head_dim),
        "self_attn.v_proj": (hidden, kv_heads * head_dim),
        "self_attn.o_proj": (heads * head_dim, hidden),
    }
    for e in range(experts):
        modules |= {
            f"mlp.experts.{e}.gate_proj": (hidden, inter),
            f"mlp.experts.{e}.up_proj": (hidden, inter),
            f"mlp.experts.{e}.down_proj": (inter, hidden),
        }
    out = []
    for layer in range(layers):
        for module, (d_in, d_out) in modules.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            out.append(TensorSpec(f"{prefix}.lora_A.weight", "BF16", (RANK, d_in)))
            out.append(TensorSpec(f"{prefix}.lora_B.weight", "BF16", (d_out, RANK)))
    return sorted(out, key=lambda s: s.name)


def bf16_pool(count: int) -> np.ndarray:
    """Trained-LoRA-like bf16 words (normal, std 0.02), reused round-robin for every tensor."""
    values32 = np.random.default_rng(0).normal(0, 0.02, count).astype(np.float32)
    return (values32.view(np.uint32) >> 16).astype(np.uint16)


def tensors(layout: list[TensorSpec], pool: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    position = 0
    for spec in layout:
        count = spec.nbytes // 2
        if position + count > pool.size:
            position = 0
        yield spec.name, pool[position : position + count].reshape(spec.shape)
        position += count


def drop_cache(path: pathlib.Path) -> None:
    with path.open("rb") as stream:
        os.posix_fadvise(stream.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def read_only(path: pathlib.Path) -> None:
    buffer = bytearray(values.CHUNK)
    with path.open("rb", buffering=0) as stream:
        while stream.readinto(buffer):
            pass


def timed(call: Callable[[], None], *, path: pathlib.Path, cold: bool, runs: int) -> float:
    times = []
    for _ in range(runs):
        if cold:
            drop_cache(path)
        else:
            read_only(path)  # warm it
        values._checked.clear()  # measure the scan, not the memo of files already found good
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    work = pathlib.Path(tempfile.mkdtemp(prefix="moelora-values-", dir=args.dir))
    adapter = work / "adapter"
    adapter.mkdir()
    weights = adapter / "adapter_model.safetensors"
    try:
        layout = specs(args.layers)
        start = time.perf_counter()
        write(weights, layout, tensors(layout, bf16_pool(64 << 20)))
        with weights.open("rb") as stream:
            os.fsync(stream.fileno())  # dirty pages would stay in the page cache
        written = time.perf_counter() - start
        (adapter / "adapter_config.json").write_text(
            json.dumps(
                {
                    "peft_type": "LORA",
                    "r": RANK,
                    "lora_alpha": 2 * RANK,
                    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                    "base_model_name_or_path": BASE,
                }
            )
        )
        (work / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
        limits = Limits(
            base_model=BASE,
            max_rank=64,
            target_modules=frozenset(),
            max_bytes=1 << 40,
            base_config=work / "config.json",
        )
        size = weights.stat().st_size
        header = safetensors_header.read(weights)
        bounds = values.Bounds(a=values.MAX_MAGNITUDE, b=values.MAX_MAGNITUDE / 2)
        rows = []
        for what, call in (
            ("read the file (1 MiB reads, nothing else)", lambda: read_only(weights)),
            ("values.check (finite, bounded)", lambda: values.check(weights, header, bounds)),
            ("validate (header, tensors vs the base model, values)", lambda: validate(adapter, limits) and None),
        ):
            for cold in (True, False):
                seconds = timed(call, path=weights, cold=cold, runs=args.runs)
                rows.append(
                    f"| {what} | {'cold' if cold else 'warm'} | {seconds:.2f} s | {size / seconds / 1e9:.2f} GB/s "
                    f"| {seconds / (size / 1e9):.2f} s/GB |"
                )
    finally:
        if not args.keep:
            for path in sorted(work.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            work.rmdir()
    print(
        f"{len(layout)} bf16 tensors, {size / 1e9:.2f} GB ({args.layers} layers of Qwen3-30B-A3B, rank {RANK}), "
        f"written in {written:.1f} s; one CPU (#{cpu}); median of {args.runs} runs\n"
    )
    print("| what | page cache | time | throughput | per GB |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\n{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}; "
        f"load average {os.getloadavg()[0]:.1f} (other processes on the machine count)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
