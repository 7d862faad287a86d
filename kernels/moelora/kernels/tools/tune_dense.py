"""Tuner of vLLM's dense LoRA ops (`lora_shrink`, `lora_expand`) on an MoE model's attention and router projections.

    python -m moelora.kernels.tools.tune_dense --model gpt-oss-20b --ranks 32 --max-loras 8 --output out/

An MoE model's LoRA adapters also cover the attention projections (q/k/v, o), and vLLM wraps the router with LoRA
too; those run on vLLM's dense punica kernels, whose defaults are far from the best at decode sizes
(docs/benchmarks.md has the served-model figures). Per projection x rank x
max_loras x token bucket this runs the same coordinate descent as tune.py on vLLM's own op (the candidate config is
handed to it in place of get_lora_op_configs), checks every candidate against a float64 reference, and writes
vLLM's `{gpu}_SHRINK.json`, `{gpu}_EXPAND_FALSE.json` and `{gpu}_EXPAND_TRUE.json`.

The expand is measured as it is served: with vLLM's dual LoRA stream (VLLM_LORA_ENABLE_DUAL_STREAM=1, which the
operator sets) each dense layer's LoRA writes into a buffer of its own (add_inputs=False, the EXPAND_FALSE file);
without it the expand adds into the layer's output (add_inputs=True). Both epilogues run the same kernel with the
same launch parameters, so a bucket measured with one fills the other's file where that has no measurement.

File format (vllm/lora/ops/triton_ops/utils.py, get_lora_op_configs): data[max_loras][num_slices][m][k][n] with
string keys, nearest key taken at every level except num_slices. vLLM's max_loras key here is the length of its
active-LoRA id table, max_loras + 1 (the "no LoRA" row); for the shrink k = the input size and n = rank, for the
expand k = rank and n = the widest output slice. Only where vLLM's kernels run (CUDA).
Resumable like tune.py: out/tune_dense_state.json holds every measured bucket.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .tune import _ints, load_state, save_state, search
from .vllm_configs import gpu_prefix, nest, write_tree

__all__ = ["DENSE_MODELS", "DenseBucket", "DenseModel", "plan", "projections", "tune_dense", "write_dense_files"]

STATE_FILE = "tune_dense_state.json"
SHRINK_FIELDS = ("block_m", "block_n", "block_k", "split_k", "group_size_m", "num_warps", "num_ctas", "num_stages")
EXPAND_FIELDS = ("block_m", "block_n", "block_k", "num_warps", "num_ctas", "num_stages")


@dataclass(frozen=True)
class DenseModel:
    name: str
    hidden: int
    q_size: int  # heads x head_dim
    kv_size: int  # kv heads x head_dim
    experts: int  # the router's output size


DENSE_MODELS = {
    "gpt-oss-20b": DenseModel("gpt-oss-20b", hidden=2880, q_size=64 * 64, kv_size=8 * 64, experts=32),
    "qwen3-30b-a3b": DenseModel("qwen3-30b-a3b", hidden=2048, q_size=32 * 128, kv_size=4 * 128, experts=128),
}


def projections(model: DenseModel) -> dict[str, tuple[int, tuple[int, ...]]]:
    """name -> (input size, output slices) of each LoRA-wrapped dense layer of one decoder block."""
    return {
        "qkv": (model.hidden, (model.q_size, model.kv_size, model.kv_size)),
        "o": (model.q_size, (model.hidden,)),
        "router": (model.hidden, (model.experts,)),
    }


@dataclass(frozen=True)
class DenseBucket:
    model: DenseModel
    proj: str
    op: str  # "shrink" | "expand"
    rank: int
    max_loras: int
    m: int
    add_inputs: bool = False  # the expand's epilogue (module docstring); the shrink has none

    @property
    def key(self) -> str:
        k, slices = projections(self.model)[self.proj]
        # Measurements of the adding epilogue (the tuner's first runs) keep their keys; the writing one is new.
        epilogue = "|write" if self.op == "expand" and not self.add_inputs else ""
        return f"dense|{self.op}|k{k}|n{'+'.join(map(str, slices))}|r{self.rank}|L{self.max_loras}|m{self.m}{epilogue}"


def plan(*, models: list[DenseModel], ranks: list[int], max_loras: list[int], ms: list[int]) -> list[DenseBucket]:
    buckets, seen = [], set()
    # Rank and adapter count outermost, in the order given, so a time-limited run covers every model at the first
    # (most used) rank and count before the next.
    for r, n_l, model, m in itertools.product(ranks, max_loras, models, ms):
        for proj, op in itertools.product(projections(model), ("shrink", "expand")):
            b = DenseBucket(model, proj, op, r, n_l, m)
            if b.key not in seen:  # two models may share a projection's shape
                seen.add(b.key)
                buckets.append(b)
    return buckets


SPACE = {
    "shrink": {
        "block_m": (16, 32, 64),
        "block_n": (16, 32, 64),
        "block_k": (32, 64, 128, 256),
        "split_k": (1, 2, 4, 8, 16, 32, 64),
        "num_warps": (2, 4, 8),
        "num_stages": (1, 2, 3, 4),
    },
    "expand": {
        "block_m": (16, 32, 64),
        "block_n": (32, 64, 128, 256),
        "block_k": (16, 32, 64),
        "num_warps": (2, 4, 8),
        "num_stages": (1, 2, 3),
    },
}


def vllm_default(op: str, *, m: int, num_slices: int) -> dict:
    """vLLM's get_lora_op_configs defaults (no folder), 0.26."""
    if op == "shrink":
        return {
            "block_m": 32,
            "block_n": 16,
            "block_k": 256 if m < 128 else 32,
            "split_k": 64 if m < 128 else 8,
            "group_size_m": 8,
            "num_warps": 4,
            "num_ctas": 1,
            "num_stages": 2,
        }
    return {
        "block_m": 64,
        "block_n": 64 if num_slices > 1 else 128,
        "block_k": 32,
        "num_warps": 4,
        "num_ctas": 1,
        "num_stages": 2,
    }


# --- inputs ---------------------------------------------------------------------------------------------------


@dataclass
class DenseInputs:
    x: torch.Tensor  # shrink: (M, K) model dtype; expand: (slices, M, r) float32, as vLLM's buffer
    weights: list[torch.Tensor]  # per slice: shrink (L, 1, r, K), expand (L, 1, N_i, r)
    out: torch.Tensor  # shrink: (slices, M, r) float32 (the op zeroes it); expand: (M, sum N_i), added into
    meta: tuple  # vLLM's LoRAKernelMeta.meta_args(...)
    lora_map: torch.Tensor

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.x, self.out, *self.weights))


def make_inputs(b: DenseBucket, *, device: torch.device, dtype: torch.dtype, seed: int) -> DenseInputs:
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    k, slices = projections(b.model)[b.proj]
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0, dt: torch.dtype = dtype) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dt)

    lora_map = torch.randint(0, b.max_loras, (b.m,), generator=g, device=device).to(torch.int32)
    meta = LoRAKernelMeta.make(b.max_loras, b.m, device=device)
    meta.prepare_tensors(lora_map)
    # specialize_active_lora=False: every LoRA row is launched, as in vLLM's CUDA graphs (grid z = max_loras + 1)
    args = meta.meta_args(b.m, False)
    if b.op == "shrink":
        return DenseInputs(
            x=rnd(b.m, k),
            weights=[rnd(b.max_loras, 1, b.rank, k, scale=k**-0.5) for _ in slices],
            out=torch.zeros(len(slices), b.m, b.rank, device=device, dtype=torch.float32),
            meta=args,
            lora_map=lora_map,
        )
    return DenseInputs(
        x=rnd(len(slices), b.m, b.rank, dt=torch.float32),
        weights=[rnd(b.max_loras, 1, n, b.rank, scale=0.05) for n in slices],
        out=rnd(b.m, sum(slices)),
        meta=args,
        lora_map=lora_map,
    )


def reference(inp: DenseInputs, op: str, scale: float = 1.0, *, add_inputs: bool = True) -> torch.Tensor:
    """The op's result in float64: shrink out[s] = scale * x @ A_s[lora]^T; expand out[:, slice s] += x[s] @
    B_s[lora]^T, or = without add_inputs (tokens mapped to -1 untouched either way)."""
    lora = inp.lora_map.long()
    has = lora >= 0
    if op == "shrink":
        ref = torch.zeros_like(inp.out, dtype=torch.float64)
        for s, a in enumerate(inp.weights):
            w = a[lora.clamp(min=0), 0].double()  # (M, r, K)
            ref[s][has] = scale * torch.einsum("mk,mrk->mr", inp.x.double(), w)[has]
        return ref
    ref = inp.out.double().clone()
    col = 0
    for s, bw in enumerate(inp.weights):
        n = bw.shape[2]
        w = bw[lora.clamp(min=0), 0].double()  # (M, N, r)
        product = torch.einsum("mr,mnr->mn", inp.x[s].double(), w)[has]
        ref[has, col : col + n] = product + (ref[has, col : col + n] if add_inputs else 0)
        col += n
    return ref


# --- vLLM's ops as candidates (tune.search's Kernel protocol) ---------------------------------------------------


class DenseVllmKernel:
    def __init__(self, b: DenseBucket):
        from vllm.lora.ops.triton_ops import lora_expand_op, lora_shrink_op

        self.b = b
        self.module = lora_shrink_op if b.op == "shrink" else lora_expand_op
        self.fn = lora_shrink_op._lora_shrink if b.op == "shrink" else lora_expand_op._lora_expand
        self.fields = SHRINK_FIELDS if b.op == "shrink" else EXPAND_FIELDS

    def baseline(self) -> tuple:
        d = vllm_default(self.b.op, m=self.b.m, num_slices=len(projections(self.b.model)[self.b.proj][1]))
        return tuple((f, d[f]) for f in self.fields)

    def neighbours(self, cand: tuple, space: dict[str, tuple]) -> list[tuple]:
        base = dict(cand)
        out = []
        for f, vs in space.items():
            for v in vs:
                if base[f] != v:
                    out.append(tuple((g, v if g == f else base[g]) for g in self.fields))
        return out

    @contextlib.contextmanager
    def _config(self, cand: tuple):
        # vLLM's op reads its launch config through this module-level name at call time.
        original = self.module.get_lora_op_configs
        self.module.get_lora_op_configs = lambda *a, **k: dict(cand) | {"max_nreg": None}
        try:
            yield
        finally:
            self.module.get_lora_op_configs = original

    def run(self, cand: tuple, inp: DenseInputs, out: torch.Tensor) -> None:
        with self._config(cand):
            if self.b.op == "shrink":
                self.fn(inp.x, inp.weights, out, *inp.meta, 1.0)
            else:
                self.fn(inp.x, inp.weights, out, *inp.meta, offset_start=0, add_inputs=self.b.add_inputs)

    def to_json(self, cand: tuple) -> dict:
        return dict(cand)


# --- outputs --------------------------------------------------------------------------------------------------


def write_dense_files(*, out_dir: Path, state: dict, device_name: str) -> list[Path]:
    """vLLM's SHRINK, EXPAND_FALSE and EXPAND_TRUE files from the whole state (a rerun rewrites the same files).
    An expand leaf measured with one epilogue only serves both files; a record without `add_inputs` was measured
    adding (the tuner's first runs)."""
    leaves: dict[tuple[str, bool], dict[tuple[str, ...], dict]] = {}
    for rec in state["buckets"].values():
        b = rec["bucket"]
        k, n = (b["k"], b["rank"]) if b["op"] == "shrink" else (b["rank"], max(b["slices"]))
        epilogue = b["op"] == "expand" and b.get("add_inputs", True)
        path = tuple(str(key) for key in (b["max_loras"] + 1, len(b["slices"]), b["m"], k, n))
        leaves.setdefault((b["op"], epilogue), {})[path] = rec["result"]["config"]
    adding, writing = leaves.get(("expand", True), {}), leaves.get(("expand", False), {})
    prefix = gpu_prefix(device_name)
    files = {
        f"{prefix}_SHRINK.json": leaves.get(("shrink", False), {}),
        f"{prefix}_EXPAND_FALSE.json": adding | writing,
        f"{prefix}_EXPAND_TRUE.json": writing | adding,
    }
    return [write_tree(out_dir / name, nest(paths)) for name, paths in files.items() if paths]


def _forget_pointer_tables() -> None:
    """vLLM caches each weight list's pointer/stride table by data_ptr, for weights that live as long as the server.
    The tuner frees a bucket's weights and the next bucket's may reuse an address with other shapes: start clean."""
    from vllm.lora.ops.triton_ops import utils

    utils._LORA_A_PTR_DICT.clear()
    utils._LORA_B_PTR_DICT.clear()


def tune_dense(
    *,
    buckets: list[DenseBucket],
    out_dir: Path,
    device: torch.device,
    device_name: str,
    dtype: torch.dtype = torch.bfloat16,
    log=print,
    passes: int = 2,
) -> dict:
    """Measure every bucket not yet in the state; returns {"measured": n, "skipped": n, "files": [...]}."""
    from .bench import l2_bytes

    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / STATE_FILE
    state = load_state(state_path)
    done = skipped = 0
    for i, b in enumerate(buckets, 1):
        head = f"[{i}/{len(buckets)}] {b.model.name} {b.proj} {b.op} rank {b.rank} max_loras {b.max_loras} m {b.m}"
        if b.key in state["buckets"]:
            skipped += 1
            continue
        _forget_pointer_tables()
        first = make_inputs(b, device=device, dtype=dtype, seed=0)
        n_sets = max(1, min(8, math.ceil(3 * l2_bytes() / first.nbytes())))  # rotate inputs past the L2
        sets = [first] + [make_inputs(b, device=device, dtype=dtype, seed=s) for s in range(1, n_sets)]
        refs = [reference(first, b.op, add_inputs=b.add_inputs)]
        log(head)
        result = search(DenseVllmKernel(b), SPACE[b.op], sets, refs, cuda=True, log=log, passes=passes)
        k, slices = projections(b.model)[b.proj]
        state["buckets"][b.key] = {
            "kernel": "vllm-dense",
            "result": result,
            "bucket": {
                "model": b.model.name,
                "proj": b.proj,
                "op": b.op,
                "rank": b.rank,
                "max_loras": b.max_loras,
                "m": b.m,
                "k": k,
                "slices": list(slices),
                "add_inputs": b.add_inputs,
            },
        }
        save_state(state_path, state)
        write_dense_files(out_dir=out_dir, state=state, device_name=device_name)  # usable even if cut short
        done += 1
        d = result["default_us"]
        log(
            f"{head}: best {result['us']:.1f} us (default {d if d is None else round(d, 1)} us, "
            f"{result['measured']} candidates, {result['rejected']} rejected)"
        )
        del sets, refs
        torch.cuda.empty_cache()
    files = write_dense_files(out_dir=out_dir, state=state, device_name=device_name)
    return {"measured": done, "skipped": skipped, "files": [str(f) for f in files]}


def report(state: dict) -> str:
    lines = [
        "| model | projection | op | rank | max_loras | M | default µs | tuned µs | speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    recs = sorted(
        state["buckets"].values(),
        key=lambda r: (
            *(r["bucket"][f] for f in ("model", "proj", "op", "rank", "max_loras", "m")),
            r["bucket"].get("add_inputs", True),
        ),
    )
    for r in recs:
        b, res = r["bucket"], r["result"]
        d, us = res["default_us"], res["us"]
        gain = "-" if d is None else f"{d / us:.2f}x"
        op = b["op"] if b["op"] == "shrink" else f"expand ({'+=' if b.get('add_inputs', True) else '='})"
        lines.append(
            f"| {b['model']} | {b['proj']} | {op} | {b['rank']} | {b['max_loras']} | {b['m']} | "
            f"{'-' if d is None else f'{d:.1f}'} | {us:.1f} | {gain} |"
        )
    return "\n".join(lines)


DEFAULT_M = (1, 8, 16, 32, 64, 256, 1024, 4096, 8192)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m moelora.kernels.tools.tune_dense",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", action="append", choices=sorted(DENSE_MODELS))
    p.add_argument("--ranks", type=_ints, default=[16, 32, 64])
    p.add_argument("--max-loras", type=_ints, default=[1, 4, 8])
    p.add_argument("--m", type=_ints, default=list(DEFAULT_M), help="token-count buckets")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--device-name", help="GPU name for the file names (default torch.cuda.get_device_name())")
    p.add_argument("--output", "-o", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--report", action="store_true", help="print the state's tuned-vs-default table and exit")
    args = p.parse_args(argv)
    if args.report:
        print(report(load_state(args.output / STATE_FILE)))
        return 0
    if not args.model:
        p.error("give --model")
    if any(r < 1 or r > 128 for r in args.ranks) or any(v < 1 for v in args.max_loras + args.m):
        p.error("ranks must be 1..128, max_loras and m positive")
    buckets = plan(models=[DENSE_MODELS[m] for m in args.model], ranks=args.ranks, max_loras=args.max_loras, ms=args.m)
    state = load_state(args.output / STATE_FILE)
    todo = [b for b in buckets if b.key not in state["buckets"]]
    print(f"# {len(buckets)} buckets, {len(todo)} to measure; output {args.output}")
    if args.dry_run:
        for b in todo:
            print(f"  {b.key}")
        return 0
    if not torch.cuda.is_available():
        print("vLLM's dense LoRA kernels need CUDA: nothing to tune here", file=sys.stderr)
        return 2
    device_name = args.device_name or torch.cuda.get_device_name()
    t0 = time.monotonic()
    res = tune_dense(
        buckets=buckets,
        out_dir=args.output,
        device=torch.device("cuda"),
        device_name=device_name,
        log=lambda msg: print(msg, flush=True),
        passes=args.passes,
    )
    print(f"# measured {res['measured']} buckets, skipped {res['skipped']}, {time.monotonic() - t0:.0f} s")
    for f in res["files"]:
        print(f"# wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
