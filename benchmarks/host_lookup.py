"""Host time of one MoE-LoRA op's launch-configuration lookup, the part of the plugin's Python that runs on every
eager forward (start-up warm-ups, graph capture's warm-up runs, prefill steps past the captured sizes) for each
of a model's MoE layers. CPU only: the bundled H200 table, GPT-OSS-20B's and Qwen3-30B-A3B's w13 and w2 ops.
Usage: PYTHONPATH=kernels:operator python benchmarks/host_lookup.py [--calls N]"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # the routing the lookup reads is built once per row, on the CPU

import torch  # noqa: E402

from moelora.kernels import default_config  # noqa: E402
from moelora.kernels.routing import moe_lora_routing  # noqa: E402

TABLE = pathlib.Path(__file__).parents[1] / "kernels/moelora/kernels/configs/NVIDIA_H200.json"
# (model, op, K, N, experts, top_k)
OPS = [
    ("GPT-OSS-20B", "w13", 2880, 5760, 32, 4),
    ("GPT-OSS-20B", "w2", 2880, 2880, 32, 4),
    ("Qwen3-30B-A3B", "w13", 2048, 768, 128, 8),
    ("Qwen3-30B-A3B", "w2", 768, 2048, 128, 8),
]


def per_call_us(*, m: int, k: int, n: int, experts: int, top_k: int, calls: int) -> float:
    generator = torch.Generator().manual_seed(m)
    topk_ids = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(m)]).to(torch.int32)
    routing = moe_lora_routing(
        topk_ids=topk_ids,
        token_lora_mapping=torch.zeros(m, dtype=torch.int32),
        num_experts=experts,
        max_loras=8,
        block_m=16,
    )
    cpu = torch.device("cpu")
    default_config(routing=routing, k=k, n=n, rank=32, device=cpu, config_file=TABLE)  # the table read once
    started = time.perf_counter()
    for _ in range(calls):
        default_config(routing=routing, k=k, n=n, rank=32, device=cpu, config_file=TABLE)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    print("| model | op | M | µs per lookup |")
    print("|---|---|---|---|")
    for model, op, k, n, experts, top_k in OPS:
        for m in (16, 256, 1600):
            us = per_call_us(m=m, k=k, n=n, experts=experts, top_k=top_k, calls=args.calls)
            print(f"| {model} | {op} | {m} | {us:.1f} |")


if __name__ == "__main__":
    main()
