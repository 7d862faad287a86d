"""Tuner of vLLM's base fused-MoE kernel (the experts' own GEMMs, not the LoRA ops) per model shape x token count.

    python -m moelora.kernels.tools.tune_moe --model gpt-oss-20b --model qwen3-30b-a3b --output out/

vLLM's Triton MoE path (`fused_experts`, also under LoRA) takes its launch config from
`E={E},N={N},device_name={GPU}.json` (fused_moe.get_config_file_name, vLLM 0.26 to 0.32): E = the experts, N = one
expert's intermediate size (the w2 weight's last dimension), GPU = torch's device name with runs of spaces and '/'
as '_' and any H200 variant as NVIDIA_H200; bf16 and fp16 weights carry no dtype suffix. It reads the file from
$VLLM_TUNED_CONFIG_FOLDER before its own bundled ones; keys are token counts, the nearest one is taken, and one
config serves both GEMMs (gate_up and down). Without a file vLLM logs "Using default MoE config".

Per bucket this runs tune.search's coordinate descent from the config vLLM picks today (its bundled file's entry,
else its size heuristic), times whole `fused_experts` calls (routing alignment, both GEMMs, the activation) with
CUDA-graph replays over input sets rotated past the L2, and rejects every candidate whose output differs from a
float64 reference. The activation is SiLU for every model: it is a separate kernel the config does not touch.
Resumable: out/tune_moe_state.json holds every measured bucket; the JSON files are rewritten after each one. A count
the time budget left out gets vLLM's own choice in the file (vLLM would take the nearest count's config for it
otherwise), marked in the state so a rerun tunes it.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .tune import MODEL_PRESETS, ModelShape, _ints, load_state, save_state, search
from .vllm_configs import write_tree

__all__ = ["SPACES", "MoeBucket", "config_file_name", "device_file_name", "main", "plan", "reference", "tune_moe"]

STATE_FILE = "tune_moe_state.json"
FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
SPACES = {
    "h200": {
        "BLOCK_SIZE_M": (16, 32, 64, 128),
        "BLOCK_SIZE_N": (32, 64, 128, 256),
        "BLOCK_SIZE_K": (64, 128, 256),
        "GROUP_SIZE_M": (1, 16, 32),
        "num_warps": (4, 8),
        "num_stages": (2, 3, 4, 5),
    },
    "tiny": {"BLOCK_SIZE_M": (16, 32), "BLOCK_SIZE_N": (16, 32)},
}
# Decode counts first: a run cut short by its budget has tuned what serving runs most.
DEFAULT_M = (16, 32, 8, 1, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def device_file_name(device_name: str) -> str:
    """vLLM's get_device_name_as_file_name plus its H200 rule (every H200 variant reads NVIDIA_H200's files)."""
    name = re.sub(r"[\s/]+", "_", device_name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(*, experts: int, inter: int, device_name: str) -> str:
    return f"E={experts},N={inter},device_name={device_file_name(device_name)}.json"


@dataclass(frozen=True)
class MoeBucket:
    model: ModelShape
    m: int

    @property
    def key(self) -> str:
        s = self.model
        return f"moe|E{s.experts}|N{s.inter}|K{s.hidden}|k{s.top_k}|m{self.m}"


def plan(*, models: list[ModelShape], ms: list[int]) -> list[MoeBucket]:
    """Models in the order given, each over every count: the first model is done whole before a budget cuts."""
    return [MoeBucket(model, m) for model in models for m in ms]


# --- inputs and the reference ---------------------------------------------------------------------------------


@dataclass
class MoeInputs:
    x: torch.Tensor  # (M, K)
    w1: torch.Tensor  # (E, 2N, K): gate rows then up rows, as vLLM's w13
    w2: torch.Tensor  # (E, K, N)
    topk_w: torch.Tensor  # (M, top_k) float32
    topk_ids: torch.Tensor  # (M, top_k) int32
    out: torch.Tensor  # (M, K) zeros: search's check measures the error against the whole output

    def nbytes_touched(self) -> int:
        """Bytes of the experts one call reads (the weights dominate)."""
        experts = int(torch.unique(self.topk_ids).numel())
        per_expert = (self.w1[0].numel() + self.w2[0].numel()) * self.w1.element_size()
        return experts * per_expert + 2 * self.x.numel() * self.x.element_size()


def make_inputs(b: MoeBucket, *, device: torch.device, dtype: torch.dtype, seed: int) -> MoeInputs:
    s = b.model
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    scores = torch.rand(b.m, s.experts, generator=g, device=device)
    topk_w, topk_ids = scores.softmax(-1).topk(s.top_k, dim=-1)
    return MoeInputs(
        x=rnd(b.m, s.hidden, scale=1.0),
        w1=rnd(s.experts, 2 * s.inter, s.hidden, scale=s.hidden**-0.5),
        w2=rnd(s.experts, s.hidden, s.inter, scale=s.inter**-0.5),
        topk_w=topk_w.float(),
        topk_ids=topk_ids.to(torch.int32),
        out=torch.zeros(b.m, s.hidden, device=device, dtype=dtype),
    )


def reference(inp: MoeInputs) -> torch.Tensor:
    """sum over a token's top-k experts of weight * (silu(x W_gate^T) * (x W_up^T)) W_down^T, in float64, one
    matrix product per expert over the tokens routed to it."""
    n = inp.w2.shape[2]
    ref = torch.zeros(inp.x.shape, dtype=torch.float64, device=inp.x.device)
    ids = inp.topk_ids.long()
    for e in torch.unique(ids).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        h = inp.x[rows].double() @ inp.w1[e].double().T
        act = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
        y = act @ inp.w2[e].double().T
        ref.index_add_(0, rows, y * inp.topk_w[rows, slots].double()[:, None])
    return ref


# --- vLLM's kernel as search's candidate runner -----------------------------------------------------------------

ExpertsFn = Callable[[MoeInputs, dict], torch.Tensor]  # (inputs, launch config) -> (M, K) output


class ExpertsKernel:
    """tune.search's Kernel protocol: a candidate is the config as a tuple of (field, value) pairs."""

    def __init__(self, experts: ExpertsFn, start: dict):
        self.experts = experts
        self.start = tuple((f, start[f]) for f in FIELDS)

    def baseline(self) -> tuple:
        return self.start

    def neighbours(self, cand: tuple, space: dict[str, tuple]) -> list[tuple]:
        base = dict(cand)
        return [
            tuple((g, v if g == f else base[g]) for g in FIELDS) for f, vs in space.items() for v in vs if base[f] != v
        ]

    def run(self, cand: tuple, inp: MoeInputs, out: torch.Tensor) -> None:
        out.copy_(self.experts(inp, dict(cand)))

    @staticmethod
    def to_json(cand: tuple) -> dict:
        return dict(cand)


def vllm_experts(inp: MoeInputs, config: dict) -> torch.Tensor:
    """vLLM's fused_experts with `config` forced for every token count (vLLM's own override hook)."""
    from vllm.model_executor.layers import fused_moe as package
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    before = package.get_config()
    try:
        with package.override_config(config):
            return fused_experts(inp.x, inp.w1, inp.w2, inp.topk_w, inp.topk_ids)
    finally:
        # vLLM's override does not restore on an exception (a candidate out of shared memory raises): without this
        # the failed candidate stays forced, and vLLM's choice for the next count would read it back.
        package._config = before


def vllm_choice(b: MoeBucket) -> dict:
    """The config vLLM runs today for this bucket without a tuned folder: its bundled file's nearest entry, else
    its size heuristic (the caller unsets VLLM_TUNED_CONFIG_FOLDER)."""
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

    s = b.model
    config = try_get_optimal_moe_config(
        (s.experts, 2 * s.inter, s.hidden), (s.experts, s.hidden, s.inter), s.top_k, None, b.m
    )
    return {f: config[f] for f in FIELDS}


# --- outputs ------------------------------------------------------------------------------------------------


def write_files(*, out_dir: Path, state: dict, device_name: str) -> list[Path]:
    """One vLLM file per (E, N) from the whole state, keys in numeric order (a rerun rewrites the same files)."""
    trees: dict[str, dict] = {}
    for rec in state["buckets"].values():
        b = rec["bucket"]
        name = config_file_name(experts=b["experts"], inter=b["inter"], device_name=device_name)
        trees.setdefault(name, {})[str(b["m"])] = rec["result"]["config"]
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_tree(out_dir / name, tree) for name, tree in sorted(trees.items())]


def tune_moe(
    *,
    buckets: list[MoeBucket],
    out_dir: Path,
    space: dict[str, tuple],
    device: torch.device,
    device_name: str,
    experts: ExpertsFn,
    start: Callable[[MoeBucket], dict],
    cuda: bool,
    dtype: torch.dtype = torch.bfloat16,
    passes: int = 2,
    budget_s: float = math.inf,
    log=print,
) -> dict:
    """Measure every bucket not yet in the state, until `budget_s` has passed; returns {"measured", "skipped",
    "left", "files"}."""
    from .bench import l2_bytes

    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / STATE_FILE
    state = load_state(state_path)
    t0 = time.monotonic()
    done = skipped = left = 0
    for i, b in enumerate(buckets, 1):
        s = b.model
        record = {"model": s.name, "experts": s.experts, "inter": s.inter, "hidden": s.hidden, "top_k": s.top_k}
        record["m"] = b.m
        if b.key in state["buckets"] and not state["buckets"][b.key].get("untuned"):
            skipped += 1
            continue
        if done and time.monotonic() - t0 > budget_s:  # at least one bucket per run
            # vLLM takes the nearest count in a file, so a count left out would get a tuned neighbour's config
            # (a decode one for a prefill size, say): write vLLM's own choice for it, marked for a later run.
            left += 1
            untuned = {"kernel": "vllm-fused-moe", "untuned": True, "bucket": record, "result": {"config": start(b)}}
            state["buckets"][b.key] = untuned
            continue
        head = f"[{i}/{len(buckets)}] {b.model.name} E={b.model.experts} N={b.model.inter} m {b.m}"
        log(head)
        first = make_inputs(b, device=device, dtype=dtype, seed=0)
        # Rotate whole input sets (weights too) so the timed calls read their experts from memory, as a served
        # model's layers do; on the CPU one set (the interpreter's times mean nothing anyway).
        n_sets = max(1, min(4, math.ceil(3 * l2_bytes() / first.nbytes_touched()))) if cuda else 1
        sets = [first] + [make_inputs(b, device=device, dtype=dtype, seed=s) for s in range(1, n_sets)]
        result = search(
            ExpertsKernel(experts, start(b)), space, sets, [reference(first)], cuda=cuda, log=log, passes=passes
        )
        state["buckets"][b.key] = {"kernel": "vllm-fused-moe", "result": result, "bucket": record}
        save_state(state_path, state)
        write_files(out_dir=out_dir, state=state, device_name=device_name)
        done += 1
        d = result["default_us"]
        log(f"{head}: best {result['us']:.1f} us (vLLM's choice {'-' if d is None else f'{d:.1f}'} us)")
        del sets
        if cuda:
            torch.cuda.empty_cache()
    save_state(state_path, state)
    files = write_files(out_dir=out_dir, state=state, device_name=device_name)
    return {"measured": done, "skipped": skipped, "left": left, "files": [str(f) for f in files]}


def report(state: dict) -> str:
    lines = ["| model | E | N | M | vLLM's choice µs | tuned µs | speed-up |", "|---|---|---|---|---|---|---|"]
    recs = sorted(state["buckets"].values(), key=lambda r: (r["bucket"]["model"], r["bucket"]["m"]))
    for r in recs:
        b, res = r["bucket"], r["result"]
        if r.get("untuned"):
            lines.append(
                f"| {b['model']} | {b['experts']} | {b['inter']} | {b['m']} | not tuned: vLLM's choice | - | - |"
            )
            continue
        d, us = res["default_us"], res["us"]
        gain = "-" if d is None else f"{d / us:.2f}x"
        lines.append(
            f"| {b['model']} | {b['experts']} | {b['inter']} | {b['m']} | {'-' if d is None else f'{d:.1f}'} | "
            f"{us:.1f} | {gain} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m moelora.kernels.tools.tune_moe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", action="append", choices=sorted(MODEL_PRESETS))
    p.add_argument("--m", type=_ints, default=list(DEFAULT_M), help="token counts, in the order to tune them")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=math.inf, help="start no bucket after this many seconds")
    p.add_argument("--device-name", help="GPU name for the file names (default torch.cuda.get_device_name())")
    p.add_argument("--output", "-o", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--report", action="store_true", help="print the state's tuned-vs-vLLM table and exit")
    args = p.parse_args(argv)
    if args.report:
        print(report(load_state(args.output / STATE_FILE)))
        return 0
    if not args.model:
        p.error("give --model")
    buckets = plan(models=[MODEL_PRESETS[m] for m in args.model], ms=args.m)
    state = load_state(args.output / STATE_FILE)
    todo = [b for b in buckets if b.key not in state["buckets"]]
    print(f"# {len(buckets)} buckets, {len(todo)} to measure; output {args.output}")
    if args.dry_run:
        for b in todo:
            print(f"  {b.key}")
        return 0
    if not torch.cuda.is_available():
        print("vLLM's fused MoE kernel needs CUDA: nothing to tune here", file=sys.stderr)
        return 2
    import os

    os.environ.pop("VLLM_TUNED_CONFIG_FOLDER", None)  # the baseline is what vLLM picks on its own
    t0 = time.monotonic()
    res = tune_moe(
        buckets=buckets,
        out_dir=args.output,
        space=SPACES["h200"],
        device=torch.device("cuda"),
        device_name=args.device_name or torch.cuda.get_device_name(),
        experts=vllm_experts,
        start=vllm_choice,
        cuda=True,
        passes=args.passes,
        budget_s=args.budget_s,
        log=lambda msg: print(msg, flush=True),
    )
    print(f"# measured {res['measured']}, skipped {res['skipped']}, left {res['left']}: {time.monotonic() - t0:.0f} s")
    for f in res["files"]:
        print(f"# wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
