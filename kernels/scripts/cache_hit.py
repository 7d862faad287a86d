"""What a Triton disk-cache hit costs our kernels: the first and second call of one MoE layer's LoRA work in a fresh
process, per routing and token count. Run it twice with one TRITON_CACHE_DIR: the first process compiles (a cold
pod), the second finds every kernel on disk (a second pod through spec.kernels.compileCache).
Usage, repo root on a CUDA machine:
    PYTHONPATH=kernels:image TRITON_CACHE_DIR=DIR python3 kernels/scripts/cache_hit.py"""

from __future__ import annotations

import os
import time

import torch

from moelora.kernels.tools.bench import default_layer_config, make_inputs, run_layer


def entries() -> int:
    d = os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
    return len(os.listdir(d)) if os.path.isdir(d) else 0


def timed(inp, cfg) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run_layer(inp, cfg)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    t_start = time.perf_counter()
    torch.zeros(1, device="cuda")
    print(f"cache entries at start: {entries()}")
    print("| model | route | M | first call ms | second call ms | new cache entries |\n|---|---|---|---|---|---|")
    for model in ("gpt-oss", "qwen3"):
        for route in ("decode", "grouped"):
            for m in (1, 16, 64):
                inp = make_inputs(model, 32, 8, m)
                cfg = default_layer_config(inp, route)
                before = entries()
                first = timed(inp, cfg)
                second = timed(inp, cfg)
                print(f"| {model} | {route} | {m} | {first:.1f} | {second:.2f} | {entries() - before} |", flush=True)
    print(f"whole process {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
