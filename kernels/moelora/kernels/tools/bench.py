"""Benchmark of one MoE layer's LoRA work (routing + gate_up op + down op), bf16, on a CUDA GPU.

    python -m moelora.kernels.tools.bench                      # headline: both models, rank 32, 8 adapters, all M
    python -m moelora.kernels.tools.bench --preset full        # ranks 16/32/64 x adapters 1/4/8/16 x all M
    python -m moelora.kernels.tools.bench --models gpt-oss --ranks 32 --adapters 8 --m 16,64 --sweep
    python -m moelora.kernels.tools.bench --w13 both             # Qwen3's w13 slices in one op and one op each

The layer is vLLM's served contract: GPT-OSS's w13 is one slice (one A, one B of width 2I), Qwen3-MoE's two (gate
and up, each its own A and B of width I), run as one op over both slices (what the plugin serves) or, with --w13
per-slice or both, also as one op per slice (what it served before).

Time: CUDA-graph replay median over 40 layer calls per graph (the graph's launch cost spread thin, as in a served
model), cycling through rotated input sets whose touched weights together exceed 3x the L2, so every call reads its
weights from HBM. Minimum bytes: each touched (adapter, expert) A and B of both ops (every slice) once, the inputs
once, both outputs read and written. Copy bandwidth: a device-to-device copy measured in the same run (bytes read +
written).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

from moelora.api.kernel_table import TableEntry
from moelora.kernels import (
    KernelConfig,
    default_block_m,
    default_config,
    fused_moe_lora,
    moe_lora_routing,
    plan_op,
    quantize_expert_lora,
)
from moelora.kernels.routing import MoeLoraRouting, method_takes, resolve_method

MODELS = {  # hidden, expert intermediate, experts, top-k
    "gpt-oss": (2880, 2880, 32, 4),
    "qwen3": (2048, 768, 128, 8),
}
# vLLM 0.33's fused MoE-LoRA op measured on one H200, bf16, rank 32, 8 adapters, CUDA-graph medians: the best of its
# default and two-kernel paths (the vLLM column of docs/benchmarks.md, Kernels).
VLLM_DOC_US = {
    "gpt-oss": {16: 61, 64: 112, 256: 205, 1600: 329},
    "qwen3": {16: 49, 64: 144, 256: 310, 1600: 629},
}
ALL_M = (1, 16, 64, 256, 1600)
# vLLM's w13 slices per model (vllm/lora/layers/fused_moe.py): GPT-OSS's fused gate_up experts are one slice.
W13_SLICES = {"gpt-oss": 1, "qwen3": 2}


@dataclass
class LayerInputs:
    hidden: torch.Tensor  # (M, H)
    down_in: torch.Tensor  # (M, top_k, I)
    gate_up_out: torch.Tensor  # (M, top_k, 2I)
    down_out: torch.Tensor  # (M, top_k, H)
    w13_a: tuple[torch.Tensor, ...]  # one (adapters, E, r, H) per slice
    w13_b: tuple[torch.Tensor, ...]  # one (adapters, E, 2I / slices, r) per slice
    w2_a: torch.Tensor
    w2_b: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    lora_map: torch.Tensor
    # With int8 weights (--weights int8): each op's scales, (slices, adapters, E, r) float32.
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None

    def nbytes(self) -> int:
        tensors = [t for v in vars(self).values() if v is not None for t in (v if isinstance(v, tuple) else (v,))]
        return sum(t.numel() * t.element_size() for t in tensors)


def make_inputs(
    model: str,
    rank: int,
    adapters: int,
    m: int,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    int8: bool = False,
) -> LayerInputs:
    h, inter, e, top_k = MODELS[model]
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    scores = torch.rand(m, e, generator=g, device=device)
    topk_w, topk_ids = scores.softmax(-1).topk(top_k, dim=-1)
    lora_map = torch.randint(0, adapters, (m,), generator=g, device=device)
    slices = W13_SLICES[model]
    inp = LayerInputs(
        hidden=rnd(m, h),
        down_in=rnd(m, top_k, inter),
        gate_up_out=rnd(m, top_k, 2 * inter),
        down_out=rnd(m, top_k, h),
        w13_a=tuple(rnd(adapters, e, rank, h, scale=h**-0.5) for _ in range(slices)),
        w13_b=tuple(rnd(adapters, e, 2 * inter // slices, rank, scale=0.05) for _ in range(slices)),
        w2_a=rnd(adapters, e, rank, inter, scale=inter**-0.5),
        w2_b=rnd(adapters, e, h, rank, scale=0.05),
        topk_ids=topk_ids.to(device=device, dtype=torch.int32),
        topk_weights=topk_w.to(device),
        lora_map=lora_map.to(device=device, dtype=torch.int32),
    )
    return quantized(inp) if int8 else inp


def quantized(inp: LayerInputs) -> LayerInputs:
    """The same inputs with the experts' LoRA weights in int8 and their scales, as the plugin serves them when asked."""
    w13 = [quantize_expert_lora(a, b) for a, b in zip(inp.w13_a, inp.w13_b, strict=True)]
    qa2, qb2, s2 = quantize_expert_lora(inp.w2_a, inp.w2_b)
    return replace(
        inp,
        w13_a=tuple(q[0] for q in w13),
        w13_b=tuple(q[1] for q in w13),
        w2_a=qa2,
        w2_b=qb2,
        w13_scale=torch.stack([q[2] for q in w13]).contiguous(),
        w2_scale=s2.unsqueeze(0).contiguous(),
    )


@dataclass(frozen=True)
class LayerConfig:
    block_m: int
    w13: KernelConfig
    w2: KernelConfig
    pdl: bool | None = None  # None: where supported; False forces it off for routing and both ops
    route_method: str = "auto"
    # All w13 slices in one op (one shrink and one expand launch); False: one op per slice.
    w13_one_op: bool = True

    def without_pdl(self) -> LayerConfig:
        return replace(self, pdl=False, w13=replace(self.w13, pdl=False), w2=replace(self.w2, pdl=False))


def default_layer_config(inp: LayerInputs, route_method: str = "auto") -> LayerConfig:
    """The op's own choice for these inputs: bundled configs of the routing kind that route_method gives."""
    m, top_k = inp.topk_ids.shape
    adapters, e = inp.w13_a[0].shape[:2]
    block_m = default_block_m(num_pairs=m * top_k, num_groups=adapters * e)
    routing = moe_lora_routing(
        topk_ids=inp.topk_ids,
        token_lora_mapping=inp.lora_map,
        num_experts=e,
        max_loras=adapters,
        block_m=block_m,
        method=route_method,
    )
    dev = inp.hidden.device
    rank = inp.w13_a[0].shape[2]
    # One slice's N, as the plugin looks it up for either path.
    w13 = default_config(routing=routing, k=inp.w13_a[0].shape[3], n=inp.w13_b[0].shape[2], rank=rank, device=dev)
    w2 = default_config(routing=routing, k=inp.w2_a.shape[3], n=inp.w2_b.shape[2], rank=rank, device=dev)
    return LayerConfig(block_m=block_m, w13=w13, w2=w2, route_method=route_method)


def routing_method(cfg: LayerConfig, inp: LayerInputs) -> str:
    """The routing method cfg runs on these inputs ("auto" and "grouped" resolved as moe_lora_routing does)."""
    return resolve_method(cfg.route_method, inp.topk_ids.numel(), inp.w13_a[0].shape[0] * inp.w13_a[0].shape[1])


def w13_ops(inp: LayerInputs, cfg: LayerConfig) -> list[dict]:
    """The gate_up op's arguments: one op over every slice, or one per slice on its columns of the output."""
    if cfg.w13_one_op:
        return [{"output": inp.gate_up_out, "lora_a": inp.w13_a, "lora_b": inp.w13_b, "scale": inp.w13_scale}]
    n = inp.w13_b[0].shape[2]
    return [
        {
            "output": inp.gate_up_out[:, :, s * n : (s + 1) * n],
            "lora_a": a,
            "lora_b": b,
            "scale": None if inp.w13_scale is None else inp.w13_scale[s : s + 1],
        }
        for s, (a, b) in enumerate(zip(inp.w13_a, inp.w13_b, strict=True))
    ]


def layer_routing(inp: LayerInputs, cfg: LayerConfig) -> MoeLoraRouting:
    """The routing both ops of the layer share, as cfg asks for it."""
    return moe_lora_routing(
        topk_ids=inp.topk_ids,
        token_lora_mapping=inp.lora_map,
        num_experts=inp.w13_a[0].shape[1],
        max_loras=inp.w13_a[0].shape[0],
        block_m=cfg.block_m,
        pdl=cfg.pdl,
        method=cfg.route_method,
    )


def run_layer(inp: LayerInputs, cfg: LayerConfig, *, stages: int = 5) -> None:
    """One MoE layer's LoRA work: routing once, then the gate_up and the down op.

    stages < 5 stops early (for the time breakdown): 1 routing, 2 + gate_up shrink (the first slice's, with one op
    per slice), 3 + gate_up expand (every slice), 4 + down shrink, 5 + down expand.
    """
    routing = layer_routing(inp, cfg)
    if stages == 5:
        for op in w13_ops(inp, cfg):
            fused_moe_lora(x=inp.hidden, routing=routing, config=cfg.w13, **op)
        fused_moe_lora(
            output=inp.down_out,
            x=inp.down_in,
            lora_a=inp.w2_a,
            lora_b=inp.w2_b,
            routing=routing,
            topk_weights=inp.topk_weights,
            mul_routed_weight=True,
            config=cfg.w2,
            scale=inp.w2_scale,
        )
        return
    gate_up = [plan_op(x=inp.hidden, routing=routing, config=cfg.w13, **op) for op in w13_ops(inp, cfg)]
    down = plan_op(
        output=inp.down_out,
        x=inp.down_in,
        lora_a=inp.w2_a,
        lora_b=inp.w2_b,
        routing=routing,
        topk_weights=inp.topk_weights,
        mul_routed_weight=True,
        config=cfg.w2,
        scale=inp.w2_scale,
    )
    # A one-pass op is one launch: its whole time counts as its "shrink" stage.
    launches = [f for op in gate_up for f in op.launches()] + list(down.launches())
    last = len(launches) - 2
    for launch in launches[: {1: 0, 2: 1, 3: last, 4: last + 1}[stages]]:
        launch()


def min_bytes(inp: LayerInputs) -> int:
    """Fewest bytes: touched (adapter, expert) A/B of both ops (every slice) once, inputs once, outputs read +
    written."""
    e = inp.w13_a[0].shape[1]
    groups = (inp.lora_map[:, None].long() * e + inp.topk_ids.long()).unique().numel()
    weights = (*inp.w13_a, *inp.w13_b, inp.w2_a, inp.w2_b)
    per_group = sum(t[0, 0].numel() * t.element_size() for t in weights)
    scales = [t for t in (inp.w13_scale, inp.w2_scale) if t is not None]
    per_group += sum(t.shape[0] * t.shape[-1] * t.element_size() for t in scales)
    acts = inp.hidden.numel() * inp.hidden.element_size() + inp.down_in.numel() * inp.down_in.element_size()
    outs = 2 * (inp.gate_up_out.numel() + inp.down_out.numel()) * inp.down_out.element_size()
    routing = inp.topk_ids.numel() * 4 + inp.topk_weights.numel() * 4 + inp.lora_map.numel() * 4
    return groups * per_group + acts + outs + routing


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(0)
    return int(getattr(props, "L2_cache_size", 60 << 20) or (60 << 20))


def time_graph(fn, *, replays: int = 25) -> float:
    """Capture fn() in a CUDA graph and return the median replay time in microseconds."""
    fn()  # warm up: compile and load kernels outside the capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    del graph
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written.

    The best of a copy kernel (torch.mul(src, 1, out=dst)) and cudaMemcpy, timed eagerly with events: a memcpy
    captured in a graph becomes a copy-engine node, well below what SM loads reach.
    """
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    best = float("inf")

    def kernel_copy() -> None:
        torch.mul(src, 1, out=dst)

    def memcpy() -> None:
        dst.copy_(src)

    for fn in (kernel_copy, memcpy):
        for _ in range(100):  # load first: an idle GPU runs at a low clock
            fn()
        times = []
        for _ in range(20):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e3)
        best = min(best, statistics.median(times))
    return 2 * nbytes / (best * 1e-6)


# Layer calls per captured graph: the graph's own launch is a fixed cost per replay, which a served model pays once
# for all its layers; one call per graph would count it in every small-M figure.
CALLS_PER_GRAPH = 40


class Case:
    """One benchmark point with its rotated input sets: together they touch more than 3x the L2 in weights, so
    every call reads its weights from HBM; the graph cycles through them CALLS_PER_GRAPH times or more."""

    def __init__(
        self, model: str, rank: int, adapters: int, m: int, *, calls: int = CALLS_PER_GRAPH, int8: bool = False
    ):
        self.model, self.rank, self.adapters, self.m = model, rank, adapters, m
        first = make_inputs(model, rank, adapters, m, seed=0, int8=int8)
        # At most ~32 GB of sets: at M = 1 a set touches ~4 MB of its 0.2-2 GB of weights.
        cap = max(2, (32 << 30) // first.nbytes())
        n_sets = max(2, min(64, cap, math.ceil(3 * l2_bytes() / min_bytes(first))))
        self.sets = [first] + [make_inputs(model, rank, adapters, m, seed=i, int8=int8) for i in range(1, n_sets)]
        self.bytes = statistics.mean(min_bytes(s) for s in self.sets)
        self.calls = max(calls, n_sets)

    def time(self, cfg: LayerConfig, stages: int = 5) -> float:
        def calls() -> None:
            for i in range(self.calls):
                run_layer(self.sets[i % len(self.sets)], cfg, stages=stages)

        return time_graph(calls) / self.calls


def vllm_status() -> str:
    try:
        import vllm  # noqa: F401
        from vllm.lora.ops.triton_ops import fused_moe_lora  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available here"
        return f"vllm not importable here ({type(exc).__name__}); vLLM column = vLLM 0.33 figures from the docs"
    return "vllm importable, but its op needs vLLM's CUDA align op; vLLM column = vLLM 0.33 figures from the docs"


def sweep(case: Case, base: LayerConfig, log) -> tuple[LayerConfig, float]:
    """Coordinate descent over the launch parameters, one at a time, on the whole layer's graph time."""
    best, best_us = base, case.time(base)
    log(f"    sweep start {best_us:.1f} us {best}")
    pairs = case.sets[0].topk_ids.numel()
    current = routing_method(best, case.sets[0])
    methods = [m for m in ("direct", "onepass", "tiny", "single", "multi") if method_takes(m, pairs)]
    if best.route_method != "auto":  # a named routing keeps its kind: a grouped sweep tunes the grouped entries
        methods = [m for m in methods if _kind(m) == _kind(current)]
    for method in methods:
        if method == current:
            continue
        us = case.time(replace(best, route_method=method))
        log(f"    route {method}: {us:.1f} us")
        if us < best_us * 0.99:
            best, best_us = replace(best, route_method=method), us
    one_pass = routing_method(best, case.sets[0]) == "onepass"
    choices = ONE_PASS_CHOICES if one_pass else TWO_KERNEL_CHOICES
    for op, (field, values) in itertools.product(("w13", "w2"), choices.items()):
        for v in values:
            cand_op = replace(getattr(best, op), **{field: v})
            cand = replace(best, **{op: cand_op})
            if cand == best:
                continue
            try:
                us = case.time(cand)
            except Exception as exc:  # noqa: BLE001
                log(f"    {op}.{field}={v} failed: {exc!s:.100}")
                continue
            if us < best_us * 0.99:
                best, best_us = cand, us
    if one_pass:  # one kernel, no expand spans to move
        log(f"    sweep best {best_us:.1f} us {best}")
        return best, best_us
    # The expand's N loop is software-pipelined only with several tiles and stages together, a move that one
    # parameter at a time cannot find. Spans that divide N give every CTA of a block the same number of tiles.
    moves = [
        (op, move)
        for op in ("w13", "w2")
        for move in PIPELINED_EXPANDS
        + even_spans(case.sets[0].w13_b[0].shape[2] if op == "w13" else case.sets[0].w2_b.shape[2])
    ]
    for op, (block_n, tiles, stages) in moves:
        cand = replace(
            best, **{op: replace(getattr(best, op), expand_block_n=block_n, expand_tiles=tiles, expand_stages=stages)}
        )
        if cand == best:
            continue
        us = case.time(cand)
        if us < best_us * 0.99:
            best, best_us = cand, us
    log(f"    sweep best {best_us:.1f} us {best}")
    return best, best_us


def _kind(method: str) -> str:
    """direct, onepass, or grouped (tiny, single and multi group the pairs alike)."""
    return method if method in ("direct", "onepass") else "grouped"


TWO_KERNEL_CHOICES = {
    "split_k": (1, 2, 4, 8, 16),
    "shrink_block_k": (64, 128, 256),
    "shrink_stages": (2, 3, 4, 5, 6),
    "shrink_warps": (2, 4, 8),
    "expand_block_n": (64, 128, 256, 512, 1024),
    "expand_warps": (4, 8),
    "expand_tiles": (1, 2, 4, 8, 16),
    "expand_stages": (1, 2, 3, 4),
    "wait_per_block": (False, True),
    "shrink_maxnreg": (None, 64, 96, 128),
    "expand_maxnreg": (None, 48, 56, 64, 72, 96),
}
# The one-kernel op's own fields (onepass routing).
ONE_PASS_CHOICES = {
    "one_pass_block_k": (32, 128),
    "one_pass_block_n": (128, 512),
    "one_pass_warps": (2, 8),
    "one_pass_stages": (1, 3),
    "one_pass_ctas_per_sm": (1, 2, 8),
}


# (expand_block_n, expand_tiles, expand_stages) tried together by the sweep: the best w13 expands kernels/scripts/
# op_grid.py found for GPT-OSS are among these.
PIPELINED_EXPANDS = [(64, 16, 3), (64, 8, 3), (128, 8, 3), (128, 16, 3), (128, 4, 3), (256, 4, 3), (256, 8, 3)]


def even_spans(n: int) -> list[tuple[int, int, int]]:
    """(expand_block_n, expand_tiles, 3) whose span divides n into 3 to 12 CTAs per block: the tile count need not be
    a power of two, and equal CTAs beat a ragged last one (docs/benchmarks-history.md, Kernels)."""
    return [
        (block_n, n // block_n // ctas, 3)
        for block_n in (64, 128)
        for ctas in range(3, 13)
        if n % (block_n * ctas) == 0 and n // block_n // ctas > 1
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("headline", "full", "quick"), default="headline")
    p.add_argument("--models", help="comma list of " + ",".join(MODELS))
    p.add_argument("--ranks", help="comma list, e.g. 16,32,64")
    p.add_argument("--adapters", help="comma list, e.g. 1,4,8,16")
    p.add_argument("--m", help="comma list of token counts")
    p.add_argument("--sweep", action="store_true", help="also search launch parameters per case (slow)")
    p.add_argument(
        "--route",
        default="auto",
        choices=("auto", "decode", "grouped", "onepass", "direct", "tiny", "single", "multi"),
        help="routing method of every case (default: what the op picks)",
    )
    p.add_argument(
        "--calls",
        type=int,
        default=CALLS_PER_GRAPH,
        help="layer calls per captured graph (1: one pass over the input sets, which leaves the graph's launch "
        "cost in small-M figures)",
    )
    p.add_argument(
        "--w13",
        default="one-op",
        choices=("one-op", "per-slice", "both"),
        help="a model with two w13 slices (Qwen3): one op over both (served), one op per slice, or both rows",
    )
    p.add_argument(
        "--weights",
        default="model",
        choices=("model", "int8"),
        help="the experts' LoRA weights in bf16 (served by default) or in int8 with scales per rank",
    )
    p.add_argument("--json", help="write all rows here")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="also time routing alone and routing + gate_up op, and the layer without PDL",
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the benchmark needs a GPU", file=sys.stderr)
        return 2

    def ints(s: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(int(v) for v in s.split(",")) if s else default

    presets = {
        "headline": ((32,), (8,), ALL_M),
        "quick": ((16, 64), (1, 16), (16, 256)),
        "full": ((16, 32, 64), (1, 4, 8, 16), ALL_M),
    }
    ranks, adapters, ms = presets[args.preset]
    models = tuple(args.models.split(",")) if args.models else tuple(MODELS)
    ranks, adapters, ms = ints(args.ranks, ranks), ints(args.adapters, adapters), ints(args.m, ms)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    dev = torch.cuda.get_device_name(0)
    bw = copy_bandwidth()
    print(
        f"# {dev}, torch {torch.__version__}, triton {__import__('triton').__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(f"# copy bandwidth {bw / 1e12:.2f} TB/s (read + write); {vllm_status()}")
    print(f"# routing {args.route}; {args.calls} or more layer calls per captured graph; weights {args.weights}")
    header = (
        "| model | w13 ops | rank | adapters | M | our µs | min MB | GB/s | % copy bw | floor µs | vLLM 0.33 µs |"
        + (" default-config µs |" if args.sweep else "")
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    rows: list[dict] = []
    tuned: list[dict] = []
    w13_modes = {"one-op": (True,), "per-slice": (False,), "both": (False, True)}[args.w13]
    cases = [
        (model, rank, n_ad, m, one_op)
        for model, rank, n_ad, m in itertools.product(models, ranks, adapters, ms)
        for one_op in (w13_modes if W13_SLICES[model] > 1 else (True,))
    ]
    case = None
    for model, rank, n_ad, m, one_op in cases:
        if case is None or (case.model, case.rank, case.adapters, case.m) != (model, rank, n_ad, m):
            del case
            torch.cuda.empty_cache()
            case = Case(model, rank, n_ad, m, calls=args.calls, int8=args.weights == "int8")
        cfg = replace(default_layer_config(case.sets[0], route_method=args.route), w13_one_op=one_op)
        w13_label = f"{'1' if one_op else W13_SLICES[model]} of {W13_SLICES[model]} slices"
        us = default_us = case.time(cfg)
        if args.sweep:
            cfg, us = sweep(case, cfg, log)
        extra = {}
        if args.breakdown:
            cum = [case.time(cfg, stages=i) for i in (1, 2, 3, 4)] + [us]
            extra = {"cumulative_us": cum, "no_pdl_us": case.time(cfg.without_pdl())}
            log(
                "  breakdown (cumulative us): routing {:.1f}, +w13 shrink {:.1f}, +w13 expand {:.1f}, "
                "+w2 shrink {:.1f}, +w2 expand {:.1f}; without PDL {:.1f}".format(*cum, extra["no_pdl_us"])
            )
        gbs = case.bytes / (us * 1e-6) / 1e9
        vllm = VLLM_DOC_US.get(model, {}).get(m) if (rank, n_ad) == (32, 8) else None
        row = {
            "model": model,
            "w13_one_op": one_op,
            "rank": rank,
            "adapters": n_ad,
            "m": m,
            "us": us,
            "min_bytes": case.bytes,
            "gbs": gbs,
            "pct_copy": 100 * case.bytes / (us * 1e-6) / bw,
            "floor_us": case.bytes / bw * 1e6,
            "vllm_doc_us": vllm,
            "default_us": default_us,
            "config": str(cfg),
            **extra,
        }
        rows.append(row)
        if args.sweep:
            h, inter, e, _ = MODELS[model]
            for op, (k, n) in (("w13", (h, 2 * inter // W13_SLICES[model])), ("w2", (inter, h))):
                # onepass routing is direct routing: the table looks its configs up among the direct entries
                direct = routing_method(cfg, case.sets[0]) in ("direct", "onepass")
                entry = TableEntry.model_validate(
                    {
                        "k": k,
                        "n": n,
                        "rank": rank,
                        "num_experts": e,
                        "max_loras": n_ad,
                        "m": m,
                        "config": asdict(getattr(cfg, op)) | {"pdl": None},
                    }
                    | ({"route": "direct"} if direct else {})
                )
                tuned.append(entry.model_dump(mode="json", exclude_unset=True))  # an entry of moelora's table
        print(
            f"| {model} | {w13_label} | {rank} | {n_ad} | {m} | {us:.1f} | {case.bytes / 1e6:.1f} | {gbs:.0f} | "
            f"{row['pct_copy']:.0f}% | {row['floor_us']:.1f} | {vllm if vllm is not None else '-'} |"
            + (f" {default_us:.1f} |" if args.sweep else ""),
            flush=True,
        )
        log(f"  {model} r{rank} L{n_ad} M{m}: {us:.1f} us, {cfg}")
        if args.json:  # after every case: a run cut short by a time limit keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"device": dev, "copy_bw": bw, "rows": rows, "tuned": tuned}, f, indent=1)
    bw_end = copy_bandwidth()
    print(f"# copy bandwidth again at the end: {bw_end / 1e12:.2f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
