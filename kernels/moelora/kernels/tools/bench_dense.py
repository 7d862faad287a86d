"""A dense layer's LoRA at decode sizes: vLLM's launches against two one-launch kernels, in CUDA graphs.

    VLLM_TUNED_CONFIG_FOLDER=kernels/moelora/kernels/configs/NVIDIA_H200 VLLM_LORA_ENABLE_DUAL_STREAM=1 \
        python -m moelora.kernels.tools.bench_dense

Per model, projection (q/k/v as one op of three slices, o) and token count, the microseconds of one layer's LoRA as
vLLM 0.26 runs it (`PunicaWrapperGPU.add_lora_linear`), each captured `--layers` times in one CUDA graph and the
replay divided by that count, so that the gaps between kernels count as they do in a served step:
- `vllm add`: the single-stream path: a float32 buffer, `lora_shrink` (which zero-fills it) and `lora_expand`
  adding into the layer's output;
- `vllm own`: the dual-stream path's LoRA side: a zero-filled output of its own, then the same shrink and an expand
  that writes it (`BaseLinearLayerWithLoRA._apply_async_impl`; the join and the add after it are not counted);
- `fused add` / `fused own`: one launch of `dense_lora` for the same two epilogues, its best launch parameters of a
  small grid (shown), its result checked against vLLM's;
- `split add` / `split own`: the same for `dense_splitk` (K split over shrink programs that hand their partial sums
  to the expand programs inside the launch); configs whose grid the GPU cannot hold at once are skipped.
The error column: the largest difference from vLLM's result (both kernels in both epilogues, and every timed split-K
config writing its own output), over the largest LoRA value.
Only on CUDA, with vLLM importable (its ops and its token grouping, `LoRAKernelMeta`); `--beside` needs no vLLM.

`--beside`: instead, the split-K kernel as the dual stream serves it, beside the layer's base GEMM: per layer a fork,
the base GEMM (the projection's weight, cuBLAS as vLLM's unquantized linear runs it) on the main stream and
`dense_splitk` writing its own output on a second stream, the join and the add. Its cost is the time over the same
layer without the LoRA (GEMM, fork, join, add); per model, projection and M the served config's and the best of the
candidates', each beside and alone, then `MOELORA_DENSE_SPLITK_CONFIGS` with the best (dense_config.parse_served):
the kernel's configs were picked alone, where a grid filling the GPU wins. Beside them, the shrink folded into the
base GEMM (dense_folded: every adapter's lora_a stacked under the weight, then one expand launch on the same stream)
over the GEMM alone, its best block_n and warps, and its error against the GEMM plus split K over the largest LoRA
value.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys

import torch

from ..dense_config import (
    MAX_SERVED_M,
    SplitKConfig,
    config_text,
    dense_layout,
    served_config,
    served_kwargs,
    served_text,
)
from ..dense_folded import fold_weight, folded_expand
from ..dense_splitk import dense_splitk
from .bench import time_graph
from .dense_one_launch import dense_lora
from .tune import _ints
from .tune_dense import DENSE_MODELS, projections

CANDIDATES = list(itertools.product((64, 128), (1, 4, 16), (256, 512), (4, 8), (2, 4)))  # n, tiles, k, warps, stages
# split_k, block_k, n_chunks, warps
SPLIT_CANDIDATES = list(itertools.product((4, 8, 16, 32), (64, 128), (8, 16, 32), (2, 4)))


def time_per_call(fn, *, layers: int) -> float:
    """Median µs per call of fn, captured `layers` times in one CUDA graph."""
    return time_graph(lambda: [fn() for _ in range(layers)]) / layers


def _grouping(max_loras: int, m: int, dev: torch.device) -> tuple[tuple, tuple]:
    """vLLM's token grouping of M tokens with every adapter busy: (its `meta_args`, dense_splitk's five of them)."""
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    meta = LoRAKernelMeta.make(max_loras, m, device=dev)
    meta.prepare_tensors(torch.arange(m, device=dev, dtype=torch.int32) % max_loras)
    args = meta.meta_args(m, False)
    return args, (args[1], args[2], args[3], args[4], int(args[6].item()))


def torch_grouping(max_loras: int, m: int, dev: torch.device) -> tuple:
    """dense_splitk's five of `_grouping`, the same tensors made with PyTorch alone: `--beside` needs no vLLM, so a
    device call can run it without unpacking vLLM's archive."""
    mapping = torch.arange(m, device=dev) % max_loras
    used = torch.unique(mapping)
    counts = torch.bincount(mapping, minlength=max_loras)[used]
    pad = torch.zeros(max_loras + 1 - used.numel(), device=dev, dtype=torch.long)  # one slot or more: -1, no tokens
    starts = torch.cat([torch.zeros(1, device=dev, dtype=torch.long), counts.cumsum(0), pad])
    ids = torch.cat([used, pad - 1])
    as32 = functools.partial(torch.Tensor.to, dtype=torch.int32)
    order = torch.argsort(mapping, stable=True)
    return as32(order), as32(torch.cat([counts, pad])), as32(starts), as32(ids), max_loras + 1


def bench(model: str, proj: str, m: int, *, rank: int, max_loras: int, layers: int) -> dict:
    from vllm.lora.ops.triton_ops import lora_expand, lora_shrink

    k, slices = projections(DENSE_MODELS[model])[proj]
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(m)
    lora_a = [(torch.randn(max_loras, 1, rank, k, device=dev, generator=g) * k**-0.5).to(dt) for _ in slices]
    lora_b = [(torch.randn(max_loras, 1, n, rank, device=dev, generator=g) * 0.05).to(dt) for n in slices]
    x = torch.randn(m, k, device=dev, generator=g).to(dt)
    base = torch.randn(m, sum(slices), device=dev, generator=g).to(dt)
    args, ours = _grouping(max_loras, m, dev)
    layout = dense_layout(lora_a, lora_b)
    y_vllm, y_ours, own, own_vllm = base.clone(), base.clone(), torch.empty_like(base), torch.empty_like(base)

    def vllm_add() -> None:
        buffer = torch.empty((len(slices), m, rank), dtype=torch.float32, device=dev)
        lora_shrink(x, lora_a, buffer, *args, 1.0)
        lora_expand(buffer, lora_b, y_vllm, *args, offset_start=0, add_inputs=True)

    def vllm_own() -> None:
        own_vllm.zero_()
        buffer = torch.empty((len(slices), m, rank), dtype=torch.float32, device=dev)
        lora_shrink(x, lora_a, buffer, *args, 1.0)
        lora_expand(buffer, lora_b, own_vllm, *args, offset_start=0, add_inputs=False)

    vllm_add()
    vllm_own()
    want = (y_vllm.float() - base.float()).abs().max().item()
    errors = []
    check_splitk = functools.partial(dense_splitk, split_k=4, block_k=64, n_chunks=4)  # a grid that fits at M = 64
    for kernel in (dense_lora, check_splitk):
        y_check = base.clone()
        kernel(y_check, x, layout, ours, add=True)
        errors.append((y_check.float() - y_vllm.float()).abs().max().item())
        own.fill_(float("nan"))
        kernel(own, x, layout, ours, add=False)
        errors.append((own.float() - own_vllm.float()).abs().nan_to_num(float("inf")).max().item())
    row = {"model": model, "proj": proj, "m": m}
    row["vllm add"], row["vllm own"] = time_per_call(vllm_add, layers=layers), time_per_call(vllm_own, layers=layers)
    for add in (True, False):
        best = None
        for split_k, bk, chunks, warps in SPLIT_CANDIDATES:
            call = functools.partial(
                dense_splitk,
                y_ours if add else own,
                x,
                layout,
                ours,
                add=add,
                split_k=split_k,
                block_k=bk,
                n_chunks=chunks,
                num_warps=warps,
            )
            try:
                t = time_per_call(call, layers=layers)
            except ValueError:  # more programs than the GPU holds at once
                continue
            if not add:  # every config's hand-off checked: `own` holds its last call's result
                errors.append((own.float() - own_vllm.float()).abs().nan_to_num(float("inf")).max().item())
            if best is None or t < best[0]:
                best = (t, f"{split_k}/{bk}/{chunks}/{warps}")
        best = best or (float("nan"), "none fits")
        row["split add" if add else "split own"], row["split config add" if add else "split config own"] = best
        best = None
        for bn, tiles, bk, w, stages in CANDIDATES:
            call = functools.partial(
                dense_lora,
                y_ours if add else own,
                x,
                layout,
                ours,
                add=add,
                block_n=bn,
                tiles=tiles,
                block_k=bk,
                num_warps=w,
                num_stages=stages,
            )
            t = time_per_call(call, layers=layers)
            if best is None or t < best[0]:
                best = (t, f"{bn}x{tiles}/{bk}/{w}/{stages}")
        row["fused add" if add else "fused own"], row["config add" if add else "config own"] = best
    row["error"] = max(errors) / max(want, 1e-6)
    return row


def bench_beside(model: str, proj: str, m: int, *, rank: int, max_loras: int, layers: int) -> dict:
    """µs per layer of the dual stream's split-K side beside the base GEMM, over the same layer without it, and of
    the shrink folded into the base GEMM (dense_folded) over the GEMM alone. Each of the graph's layers has weights of
    its own, as a served step has: one layer's replayed would sit in L2."""
    k, slices = projections(DENSE_MODELS[model])[proj]
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(m)

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dt)

    loras = [
        (
            [randn(max_loras, 1, rank, k, scale=k**-0.5) for _ in slices],
            [randn(max_loras, 1, n, rank, scale=0.05) for n in slices],
        )
        for _ in range(layers)
    ]
    layouts = [dense_layout(a, b) for a, b in loras]
    weights = [randn(sum(slices), k, scale=k**-0.5) for _ in range(layers)]
    folded_weights = [fold_weight(w, a) for w, (a, _) in zip(weights, loras, strict=True)]
    x = randn(m, k, scale=1.0)
    out, own = torch.empty(m, sum(slices), device=dev, dtype=dt), torch.zeros(m, sum(slices), device=dev, dtype=dt)
    folded = torch.empty(m, folded_weights[0].shape[0], device=dev, dtype=dt)
    ours = torch_grouping(max_loras, m, dev)
    side = torch.cuda.Stream()

    def lora(config: SplitKConfig, layout) -> functools.partial:
        return functools.partial(dense_splitk, own, x, layout, ours, add=False, **served_kwargs(config))

    def beside(config: SplitKConfig | None) -> float:
        """µs per layer of `layers` layers in one CUDA graph: the base GEMM, and the LoRA beside it (None: none)."""

        def run() -> None:
            for weight, layout in zip(weights, layouts, strict=True):
                main = torch.cuda.current_stream()
                side.wait_stream(main)
                torch.mm(x, weight.t(), out=out)
                if config is not None:
                    with torch.cuda.stream(side):
                        lora(config, layout)()
                main.wait_stream(side)
                out.add_(own)

        return time_graph(run) / layers

    def alone(config: SplitKConfig) -> float:
        return time_graph(lambda: [lora(config, layout)() for layout in layouts]) / layers

    def fold(block_n: int, warps: int) -> None:
        for wp, layout in zip(folded_weights, layouts, strict=True):
            torch.mm(x, wp.t(), out=folded)
            folded_expand(out, folded, layout, ours, max_loras=max_loras, block_n=block_n, num_warps=warps)

    gemm = time_graph(lambda: [torch.mm(x, w.t(), out=out) for w in weights]) / layers
    plain = beside(None)
    rows = []
    served = served_config(m, len(slices))
    candidates = [SplitKConfig(s, bk, chunks, num_warps=w) for s, bk, chunks, w in SPLIT_CANDIDATES]
    for config in candidates + ([served] if served is not None and served not in candidates else []):
        try:
            rows.append((beside(config) - plain, alone(config), config))
        except ValueError:  # more programs than the GPU holds at once
            continue
    best = min(rows, key=lambda r: r[0])
    at_served = next((r for r in rows if r[2] == served), None)
    folds = [
        (time_graph(functools.partial(fold, bn, w)) / layers - gemm, bn, w)
        for bn, w in itertools.product((32, 64, 128), (2, 4))
        if not any(n % bn for n in slices)
    ]
    # The folded result against the GEMM and the split-K LoRA (the last layer's, both in `out` and `own`).
    fold(*min(folds)[1:])
    want = out.float().clone()
    torch.mm(x, weights[-1].t(), out=out)
    lora(SplitKConfig(4, 64, 4), layouts[-1])()
    error = (want - out.float() - own.float()).abs().max().item() / max(own.float().abs().max().item(), 1e-6)
    return {"gemm": gemm, "plain": plain, "best": best, "served": at_served, "folded": min(folds), "error": error}


def configs_text(picked: list[tuple[int, int, SplitKConfig]]) -> str:
    """`MOELORA_DENSE_SPLITK_CONFIGS` for (slices, M, config) picks: the served window's M only, each kind's rising."""
    kinds: dict[str, list[tuple[int, SplitKConfig]]] = {}
    for slices, m, config in sorted(picked, key=lambda p: p[1]):
        if 2 <= m <= MAX_SERVED_M:
            kinds.setdefault("several" if slices > 1 else "one", []).append((m, config))
    return served_text({kind: tuple(classes) for kind, classes in kinds.items()})


def main_beside(args: argparse.Namespace) -> int:
    print(f"# {torch.cuda.get_device_name()}, rank {args.rank}, {args.max_loras} adapters, µs per layer")
    print(
        "| model | proj | M | GEMM | GEMM, fork, join, add | served (split/k/chunks/w): beside, alone "
        "| best beside (split/k/chunks/w): beside, alone | folded (block_n/w): over GEMM | folded error / max LoRA |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        picked = []
        for proj in args.projections.split(","):
            for m in args.m:
                r = bench_beside(model, proj, m, rank=args.rank, max_loras=args.max_loras, layers=args.layers)
                served = r["served"]
                at_served = "-" if served is None else f"({config_text(served[2])}) +{served[0]:.1f}, {served[1]:.1f}"
                beside, alone, config = r["best"]
                over, bn, warps = r["folded"]
                print(
                    f"| {model} | {proj} | {m} | {r['gemm']:.1f} | {r['plain']:.1f} | {at_served} | "
                    f"({config_text(config)}) +{beside:.1f}, {alone:.1f} | ({bn}/{warps}) +{over:.1f} | "
                    f"{r['error']:.1e} |",
                    flush=True,
                )
                picked.append((len(projections(DENSE_MODELS[model])[proj][1]), m, config))
        print(f"\n{model}: MOELORA_DENSE_SPLITK_CONFIGS={configs_text(picked)}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt-oss-20b,qwen3-30b-a3b")
    p.add_argument("--projections", default="qkv,o")
    p.add_argument("--m", type=_ints, default=[1, 16, 64])
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--max-loras", type=int, default=8)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--beside", action="store_true", help="the served side beside the base GEMM (module docstring)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    if args.beside:
        return main_beside(args)
    print(f"# {torch.cuda.get_device_name()}, rank {args.rank}, {args.max_loras} adapters, µs per layer call")
    print(
        "| model | proj | M | vllm add | fused add (n x tiles/k/warps/st.) | split add (split/k/chunks/w) | vllm own "
        "| fused own | split own | error / max LoRA |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for proj in args.projections.split(","):
            for m in args.m:
                r = bench(model, proj, m, rank=args.rank, max_loras=args.max_loras, layers=args.layers)
                print(
                    f"| {model} | {proj} | {m} | {r['vllm add']:.1f} | {r['fused add']:.1f} ({r['config add']}) | "
                    f"{r['split add']:.1f} ({r['split config add']}) | {r['vllm own']:.1f} | "
                    f"{r['fused own']:.1f} ({r['config own']}) | {r['split own']:.1f} ({r['split config own']}) | "
                    f"{r['error']:.1e} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
