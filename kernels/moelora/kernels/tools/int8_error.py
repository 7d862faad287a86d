"""What int8 expert LoRA weights (quant.py, served with spec.kernels.expertLoraWeights: int8) cost an adapter's
contribution: the relative error of (x @ A.T) @ B.T against bf16 weights, in float64, per model op and weight
distribution. CPU only; prints a markdown table.

    python -m moelora.kernels.tools.int8_error
"""

from __future__ import annotations

import argparse

import torch

from moelora.kernels import dequantize_expert_lora, quantize_expert_lora

# One expert's (K, N) per op: vLLM's w13 (one gate_up slice for Qwen3, GPT-OSS's fused gate_up) and w2.
OPS = {
    "qwen3 w13": (2048, 768),
    "qwen3 w2": (768, 2048),
    "gpt-oss w13": (2880, 5760),
    "gpt-oss w2": (2880, 2880),
}


def weights(dist: str, experts: int, rank: int, k: int, n: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A (E, r, K) at 1/sqrt(K) and B (E, N, r) at 0.01, bf16, drawn from `dist`."""
    if dist == "uniform":  # peft's kaiming-uniform A
        a = torch.rand(experts, rank, k, generator=g) * 2 - 1
        b = torch.randn(experts, n, rank, generator=g)
    elif dist == "gaussian":
        a = torch.randn(experts, rank, k, generator=g)
        b = torch.randn(experts, n, rank, generator=g)
    else:  # Student's t with 3 degrees of freedom: heavy tails, a few large weights set each rank's scale
        a = (
            torch.randn(experts, rank, k, generator=g)
            / (torch.randn(experts, rank, k, 3, generator=g) ** 2).mean(-1).sqrt()
        )
        b = (
            torch.randn(experts, n, rank, generator=g)
            / (torch.randn(experts, n, rank, 3, generator=g) ** 2).mean(-1).sqrt()
        )
    return (a / k**0.5).to(torch.bfloat16), (b * 0.01).to(torch.bfloat16)


def relative_error(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> float:
    da, db = dequantize_expert_lora(*quantize_expert_lora(a, b))
    exact = (x @ a.double().transpose(-1, -2)) @ b.double().transpose(-1, -2)
    rounded = (x @ da.transpose(-1, -2)) @ db.transpose(-1, -2)
    return ((rounded - exact).norm() / exact.norm()).item()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--experts", type=int, default=4, help="experts drawn per op (each its own scales)")
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    dists = ("uniform", "gaussian", "student-t 3")
    print(f"rank {args.rank}, {args.experts} experts, {args.tokens} tokens of N(0, 1) inputs")
    print("| op | K | N | " + " | ".join(dists) + " |")
    print("|---|---|---|" + "---|" * len(dists))
    for op, (k, n) in OPS.items():
        x = torch.randn(args.tokens, k, generator=g, dtype=torch.float64)
        cells = []
        for dist in dists:
            a, b = weights(dist, args.experts, args.rank, k, n, g)
            cells.append(f"{100 * relative_error(a, b, x.unsqueeze(0)):.2f}%")
        print(f"| {op} | {k} | {n} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
