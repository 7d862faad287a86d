"""Tuner of the fused MoE-LoRA ops: searches launch parameters per model shape x rank x max_loras x token bucket.

    python -m moelora.kernels.tools.tune --model gpt-oss-20b --ranks 16,32,64 --max-loras 1,4,8 --output out/
    python -m moelora.kernels.tools.tune --model qwen3-30b-a3b --dry-run          # print the plan only

For every bucket and op (w13 = gate_up, w2 = down) it runs a coordinate descent from the default config (one field
at a time over the space's values, a change kept when >= 1% faster), checks every candidate's output against the
float64 reference (a wrong one is rejected and logged), and writes
- out/configs/<GPU>.json: our kernel's configs in the format launch_config.default_config reads (copy it into
  kernels/moelora/kernels/configs/ to bundle it);
- out/<GPU>_FUSED_MOE_LORA_{W13,W2}_{SHRINK,EXPAND}.json: vLLM's tuned configs for its own fused_moe_lora op
  (vllm_configs.py has the format), timed on vLLM's op — only where vLLM's kernels can run (CUDA). Mount the folder
  as VLLM_TUNED_CONFIG_FOLDER.
Timing: CUDA-graph replay medians on a GPU (bench.time_graph, inputs rotated past the L2); on the CPU the kernels
run in Triton's interpreter and are timed by wall clock — that exercises the pipeline, the numbers mean nothing.
Resumable: out/tune_state.json holds every measured bucket (written after each one); a rerun skips them and
rewrites the output files from the whole state.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from moelora.api.kernel_table import KernelTable, TableEntry
from moelora.kernels import KernelConfig, default_block_m, default_config, fused_moe_lora, moe_lora_routing

from .vllm_configs import LEAF_FIELDS, VllmEntry, call_vllm_op, gpu_prefix, vllm_op, write_vllm_files

__all__ = ["MODEL_PRESETS", "SPACES", "ModelShape", "main", "plan", "tune"]

STATE_FILE = "tune_state.json"


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    inter: int  # one expert's intermediate size (w13 produces 2 x inter)
    experts: int
    top_k: int
    w13_slices: int  # how vLLM calls the w13 op: 2 for gated FusedMoEWithLoRA, 1 for 3D-expert models


MODEL_PRESETS = {
    "gpt-oss-20b": ModelShape("gpt-oss-20b", 2880, 2880, 32, 4, w13_slices=1),  # 3D experts in vLLM
    "qwen3-30b-a3b": ModelShape("qwen3-30b-a3b", 2048, 768, 128, 8, w13_slices=2),
}

# Values per field for the coordinate descent. "h200": wide enough for the H200 library at ~20 candidates per op
# and bucket; "tiny": the CPU test's (interpreter, tiny shapes).
SPACES: dict[str, dict[str, dict[str, tuple]]] = {
    "h200": {
        "ours": {
            "split_k": (1, 2, 4, 8, 16),
            "shrink_block_k": (64, 128, 256),
            "shrink_warps": (2, 4, 8),
            "shrink_stages": (2, 3, 4),
            "expand_block_n": (64, 128, 256, 512),
            "expand_warps": (4, 8),
            "expand_tiles": (1, 2, 8),
            "expand_stages": (1, 3),
        },
        "vllm": {
            "block_m": (16, 32, 64),
            "shrink.block_k": (32, 64, 128),
            "shrink.split_k": (1, 2, 4),
            "shrink.num_warps": (4, 8),
            "shrink.num_stages": (2, 3, 4),
            "expand.block_n": (32, 64, 128, 256),
            "expand.num_warps": (4, 8),
            "expand.num_stages": (2, 3),
        },
    },
    "tiny": {
        "ours": {"split_k": (1, 2), "shrink_block_k": (16, 32), "expand_block_n": (16, 32)},
        "vllm": {"block_m": (16, 32), "shrink.block_k": (16, 32)},
    },
}
DEFAULT_M = (1, 16, 64, 256, 1024)


@dataclass(frozen=True)
class Bucket:
    model: ModelShape
    op: str  # "w13" | "w2"
    rank: int
    max_loras: int
    m: int
    kernel: str  # "ours" | "vllm"

    @property
    def key(self) -> str:
        s = self.model
        return (
            f"{self.kernel}|{s.hidden}x{s.inter}xE{s.experts}xk{s.top_k}s{s.w13_slices}|{self.op}"
            f"|r{self.rank}|L{self.max_loras}|m{self.m}"
        )

    @property
    def k_n(self) -> tuple[int, int]:
        """(K, N) of one call of the op (w13: one slice of the gate_up output)."""
        s = self.model
        return (s.hidden, 2 * s.inter // s.w13_slices) if self.op == "w13" else (s.inter, s.hidden)


def plan(
    *, models: list[ModelShape], ranks: list[int], max_loras: list[int], ms: list[int], kernels: list[str]
) -> list[Bucket]:
    return [
        Bucket(model, op, r, n_l, m, kern)
        for model, r, n_l, m, op, kern in itertools.product(models, ranks, max_loras, ms, ("w13", "w2"), kernels)
    ]


# --- inputs and the correctness check -------------------------------------------------------------------------


@dataclass
class OpInputs:
    x: torch.Tensor  # (M, K) for w13, (M, top_k, K) for w2
    a: list[torch.Tensor]  # per slice (L, E, r, K)
    b: list[torch.Tensor]  # per slice (L, E, N, r)
    out: torch.Tensor  # (M, top_k, slices * N)
    topk_ids: torch.Tensor
    topk_w: torch.Tensor
    lora_map: torch.Tensor

    def nbytes(self) -> int:
        ts = [self.x, self.out, self.topk_ids, self.topk_w, self.lora_map, *self.a, *self.b]
        return sum(t.numel() * t.element_size() for t in ts)


def make_op_inputs(b: Bucket, *, slices: int, device: torch.device, dtype: torch.dtype, seed: int) -> OpInputs:
    s, (k, n) = b.model, b.k_n
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    scores = torch.rand(b.m, s.experts, generator=g, device=device)
    topk_w, topk_ids = scores.softmax(-1).topk(s.top_k, dim=-1)
    x = rnd(b.m, k) if b.op == "w13" else rnd(b.m, s.top_k, k)
    return OpInputs(
        x=x,
        a=[rnd(b.max_loras, s.experts, b.rank, k, scale=k**-0.5) for _ in range(slices)],
        b=[rnd(b.max_loras, s.experts, n, b.rank, scale=0.05) for _ in range(slices)],
        out=rnd(b.m, s.top_k, slices * n),
        topk_ids=topk_ids.to(torch.int32),
        topk_w=topk_w,
        lora_map=torch.randint(0, b.max_loras, (b.m,), generator=g, device=device).to(torch.int32),
    )


def reference(inp: OpInputs, op: str, *, chunk: int = 256) -> torch.Tensor:
    """out + the op's LoRA contribution in float64: reference.moe_lora_reference's math, batched over chunks of
    pairs (that one loops per pair with host syncs: seconds per bucket at M=1024 on a GPU)."""
    m, top_k = inp.topk_ids.shape
    n = inp.b[0].shape[2]
    ref = inp.out.double().clone().view(m * top_k, -1)
    lora = inp.lora_map.long().repeat_interleave(top_k)
    expert = inp.topk_ids.reshape(-1).long()
    pairs = torch.nonzero((lora >= 0) & (lora < inp.a[0].shape[0])).flatten()
    rows = inp.x.reshape(m * top_k, -1) if inp.x.dim() == 3 else inp.x
    w = inp.topk_w.reshape(-1).double()
    for i, (a, b_) in enumerate(zip(inp.a, inp.b)):
        for c in pairs.split(chunk):
            l_, e_ = lora[c], expert[c]
            x = (rows[c] if inp.x.dim() == 3 else rows[c // top_k]).double()
            inter = torch.einsum("pk,prk->pr", x, a[l_, e_].double())
            delta = torch.einsum("pr,pnr->pn", inter, b_[l_, e_].double())
            if op == "w2":
                delta = delta * w[c, None]
            ref[c, i * n : (i + 1) * n] += delta
    return ref.view(m, top_k, -1)


def check(got: torch.Tensor, ref: torch.Tensor, base: torch.Tensor) -> str | None:
    """None when got matches the float64 reference, else why not. The tolerance scales with the LoRA delta
    (ref - base), not with the output, so a dropped or doubled contribution cannot hide in the output's rounding;
    plus the output dtype's rounding of the largest value."""
    tol = 1e-3 if got.dtype == torch.float32 else 3e-2
    delta = (ref - base.double()).abs().max().item()
    allowed = tol * delta + 2 * torch.finfo(got.dtype).eps * ref.abs().max().item()
    err = (got.double() - ref).abs().max().item()
    if not math.isfinite(err) or err > allowed:
        return f"max error {err:.3g} > {allowed:.3g}"
    return None


# --- the two kernels as candidates ---------------------------------------------------------------------------


class Kernel:
    """One bucket's runner: `run(cand, inp, out)` adds the op's result for candidate `cand` into `out`."""

    def baseline(self) -> object: ...
    def neighbours(self, cand: object, space: dict[str, tuple]) -> list[object]: ...
    def run(self, cand: object, inp: OpInputs, out: torch.Tensor) -> None: ...


class OursKernel(Kernel):
    def __init__(self, b: Bucket, sets: list[OpInputs]):
        self.b = b
        self.block_m = default_block_m(num_pairs=b.m * b.model.top_k, num_groups=b.max_loras * b.model.experts)
        # The routing is shared by a layer's two ops, so it is not part of the op's time.
        self.routing = {
            id(s): moe_lora_routing(
                topk_ids=s.topk_ids,
                token_lora_mapping=s.lora_map,
                num_experts=b.model.experts,
                max_loras=b.max_loras,
                block_m=self.block_m,
            )
            for s in sets
        }
        self.first = sets[0]

    def baseline(self) -> KernelConfig:
        k, n = self.b.k_n
        return default_config(
            routing=self.routing[id(self.first)], k=k, n=n, rank=self.b.rank, device=self.first.x.device
        )

    def neighbours(self, cand: KernelConfig, space: dict[str, tuple]) -> list[KernelConfig]:
        return [replace(cand, **{f: v}) for f, vs in space.items() for v in vs if getattr(cand, f) != v]

    def run(self, cand: KernelConfig, inp: OpInputs, out: torch.Tensor) -> None:
        n = inp.b[0].shape[2]
        for i, (a, b_) in enumerate(zip(inp.a, inp.b)):
            fused_moe_lora(
                output=out[:, :, i * n : (i + 1) * n],
                x=inp.x,
                lora_a=a,
                lora_b=b_,
                routing=self.routing[id(inp)],
                topk_weights=inp.topk_w,
                mul_routed_weight=self.b.op == "w2",
                config=cand,
            )

    @staticmethod
    def to_json(cand: KernelConfig) -> dict:
        return asdict(cand) | {"pdl": None}


class VllmKernel(Kernel):
    """vLLM's fused_moe_lora op; a candidate is (block_m, shrink leaf, expand leaf) as in its config files."""

    def __init__(self, b: Bucket, sets: list[OpInputs], op: Callable[..., None]):
        from .vllm_configs import align_blocks

        self.b, self.op, self.sets = b, op, sets
        self.layouts: dict[tuple[int, int], tuple] = {}
        self._align = align_blocks

    def baseline(self) -> tuple:
        # vLLM's own defaults for the fused ops (get_lora_op_configs without a folder).
        r = self.b.rank
        shrink = {
            "block_m": 64,
            "block_n": min(64, _pow2(r)),
            "block_k": 32,
            "group_size_m": 8,
            "num_warps": 4,
            "num_stages": 3,
            "split_k": 1,
        }
        expand = {
            "block_m": 64,
            "block_n": 64,
            "block_k": max(16, min(32, _pow2(r))),
            "group_size_m": 8,
            "num_warps": 4,
            "num_stages": 3,
            "split_k": 1,
        }
        return _freeze(shrink), _freeze(expand)

    def neighbours(self, cand: tuple, space: dict[str, tuple]) -> list[tuple]:
        out = []
        shrink, expand = dict(cand[0]), dict(cand[1])
        for f, vs in space.items():
            for v in vs:
                s2, e2 = dict(shrink), dict(expand)
                if f == "block_m":  # shared: the routing layout is built for it
                    s2["block_m"] = e2["block_m"] = v
                else:
                    which, field = f.split(".")
                    (s2 if which == "shrink" else e2)[field] = v
                new = (_freeze(s2), _freeze(e2))
                if new != cand:
                    out.append(new)
        return out

    def run(self, cand: tuple, inp: OpInputs, out: torch.Tensor) -> None:
        shrink, expand = dict(cand[0]), dict(cand[1])
        key = (id(inp), shrink["block_m"])
        m, top_k = inp.topk_ids.shape
        if m * top_k * 8 <= self.b.model.experts * self.b.max_loras:
            # vLLM's naive block assignment at this size (punica_gpu.add_lora_w13's SPARSITY_FACTOR rule): no
            # sorted ids, expert_ids = topk_ids flattened.
            self.layouts[key] = (None, inp.topk_ids.reshape(-1), None)
        elif key not in self.layouts:
            self.layouts[key] = self._align(
                topk_ids=inp.topk_ids,
                token_lora_mapping=inp.lora_map,
                num_experts=self.b.model.experts,
                max_loras=self.b.max_loras,
                block_m=shrink["block_m"],
            )
        x = inp.x if inp.x.dim() == 2 else inp.x.reshape(-1, inp.x.shape[-1])
        call_vllm_op(
            self.op,
            output=out,
            x=x,
            lora_a=inp.a,
            lora_b=inp.b,
            topk_weights=inp.topk_w,
            layout=self.layouts[key],
            token_lora_mapping=inp.lora_map,
            rank=self.b.rank,
            mul_routed_weight=self.b.op == "w2",
            shrink=shrink,
            expand=expand,
        )

    @staticmethod
    def to_json(cand: tuple) -> dict:
        return {"shrink": dict(cand[0]), "expand": dict(cand[1])}


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def _freeze(d: dict) -> tuple:
    return tuple((f, d[f]) for f in LEAF_FIELDS)


# --- timing ---------------------------------------------------------------------------------------------------


def time_us(fn: Callable[[], None], *, cuda: bool) -> float:
    if cuda:
        from .bench import time_graph

        return time_graph(fn)
    fn()  # warm-up: the interpreter's first call also traces
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def measure(kernel: Kernel, cand, sets: list[OpInputs], refs: list[torch.Tensor], *, cuda: bool) -> float | str:
    """Time of one call (us), or why the candidate was rejected."""
    try:
        got = sets[0].out.clone()
        kernel.run(cand, sets[0], got)
        why = check(got, refs[0], sets[0].out)
        if why is not None:
            return f"wrong result: {why}"
        scratch = [s.out.clone() for s in sets]

        def calls() -> None:
            for s, o in zip(sets, scratch):
                kernel.run(cand, s, o)

        return time_us(calls, cuda=cuda) / len(sets)
    except Exception as exc:  # noqa: BLE001 - a config the compiler or launcher refuses is just not a candidate
        return f"failed: {type(exc).__name__}: {exc!s:.120}"


def search(kernel: Kernel, space: dict[str, tuple], sets, refs, *, cuda: bool, log, passes: int = 2) -> dict:
    """Coordinate descent: sweep every field's values around the best so far, `passes` times at most."""
    base = kernel.baseline()
    base_us = measure(kernel, base, sets, refs, cuda=cuda)
    counts = {"measured": 1, "rejected": 0}
    best, best_us = (base, base_us) if isinstance(base_us, float) else (None, math.inf)
    log(f"    baseline: {base_us if isinstance(base_us, str) else f'{base_us:.1f} us'}")
    seen = {base}
    for _ in range(passes):
        improved = False
        for cand in kernel.neighbours(best if best is not None else base, space):
            if cand in seen:
                continue
            seen.add(cand)
            us = measure(kernel, cand, sets, refs, cuda=cuda)
            counts["measured"] += 1
            if isinstance(us, str):
                counts["rejected"] += 1
                log(f"    rejected {_short(kernel.to_json(cand))}: {us}")
                continue
            if us < best_us * 0.99:
                best, best_us, improved = cand, us, True
            log(f"    {us:9.1f} us  best {best_us:9.1f} us  {_short(kernel.to_json(cand))}")
        if not improved:
            break
    if best is None:
        raise RuntimeError("every candidate was rejected (wrong results or failures): nothing to write")
    return {
        "config": kernel.to_json(best),
        "us": best_us,
        "default_us": base_us if isinstance(base_us, float) else None,
        **counts,
    }


def _short(d: dict) -> str:
    return json.dumps(d, separators=(",", ":"))[:160]


# --- state and outputs ----------------------------------------------------------------------------------------


def load_state(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"version": 1, "buckets": {}}


def save_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(path)  # atomic: an interrupted run never leaves a torn state


def write_outputs(*, out_dir: Path, state: dict, device_name: str, source: str) -> list[Path]:
    entries: list[TableEntry] = []
    vllm_entries: list[VllmEntry] = []
    for rec in state["buckets"].values():
        b = rec["bucket"]
        if rec["kernel"] == "ours":
            entries.append(
                TableEntry.model_validate(
                    {
                        "k": b["k"],
                        "n": b["n"],
                        "rank": b["rank"],
                        "num_experts": b["experts"],
                        "max_loras": b["max_loras"],
                        "m": b["m"],
                        "config": rec["result"]["config"],
                    }
                )
            )
            continue
        leaves = rec["result"]["config"]
        # w13: vLLM keys i by lora_b's rows per slice; w2: by lora_a's columns (= the intermediate size)
        inter = b["n"] if b["op"] == "w13" else b["k"]
        slices = b["slices"] if b["op"] == "w13" else 1
        for part in ("shrink", "expand"):
            vllm_entries.append(
                VllmEntry(
                    op=f"{b['op']}_{part}",
                    max_loras=b["max_loras"],
                    num_slices=slices,
                    m=b["m"],
                    rank=b["rank"],
                    hidden=b["hidden"],
                    inter=inter,
                    leaf=leaves[part],
                )
            )
    written = []
    if entries:
        cfg_dir = out_dir / "configs"
        cfg_dir.mkdir(parents=True, exist_ok=True)
        path = cfg_dir / f"{gpu_prefix(device_name)}.json"
        table = KernelTable(device=device_name, source=source, entries=tuple(sorted(entries, key=TableEntry.key)))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(table.dump())
        tmp.replace(path)
        written.append(path)
    if vllm_entries:
        written += write_vllm_files(out_dir=out_dir, device_name=device_name, entries=vllm_entries)
    return written


# --- the run ----------------------------------------------------------------------------------------------------


def tune(
    *,
    buckets: list[Bucket],
    out_dir: Path,
    space: dict[str, dict[str, tuple]],
    device: torch.device,
    device_name: str,
    vllm: Callable[..., None] | None,
    dtype: torch.dtype,
    log=print,
    passes: int = 2,
) -> dict:
    """Measure every bucket not yet in the state; returns {"measured": n, "skipped": n, "files": [...]}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / STATE_FILE
    state = load_state(state_path)
    cuda = device.type == "cuda"
    done = skipped = 0
    for i, b in enumerate(buckets, 1):
        head = f"[{i}/{len(buckets)}] {b.kernel} {b.model.name} {b.op} rank {b.rank} max_loras {b.max_loras} m {b.m}"
        if b.key in state["buckets"]:
            skipped += 1
            log(f"{head}: done before, {state['buckets'][b.key]['result']['us']:.1f} us")
            continue
        if b.kernel == "vllm" and vllm is None:
            continue
        slices = b.model.w13_slices if (b.kernel == "vllm" and b.op == "w13") else 1
        first = make_op_inputs(b, slices=slices, device=device, dtype=dtype, seed=0)
        n_sets = 1
        if cuda:  # rotate inputs past the L2 so every call reads its weights from HBM, as in a real step
            from .bench import l2_bytes

            n_sets = max(1, min(8, math.ceil(3 * l2_bytes() / first.nbytes())))
        sets = [first] + [
            make_op_inputs(b, slices=slices, device=device, dtype=dtype, seed=s) for s in range(1, n_sets)
        ]
        refs = [reference(sets[0], b.op)]
        kernel = OursKernel(b, sets) if b.kernel == "ours" else VllmKernel(b, sets, vllm)
        log(head)
        result = search(kernel, space[b.kernel], sets, refs, cuda=cuda, log=log, passes=passes)
        k, n = b.k_n
        state["buckets"][b.key] = {
            "kernel": b.kernel,
            "result": result,
            "bucket": {
                "model": b.model.name,
                "op": b.op,
                "rank": b.rank,
                "max_loras": b.max_loras,
                "m": b.m,
                "k": k,
                "n": n,
                "hidden": b.model.hidden,
                "experts": b.model.experts,
                "slices": slices,
            },
        }
        save_state(state_path, state)
        done += 1
        default = result["default_us"]
        log(
            f"{head}: best {result['us']:.1f} us (default {default if default is None else round(default, 1)} us, "
            f"{result['measured']} candidates, {result['rejected']} rejected)"
        )
        del sets, refs, kernel
        if cuda:
            torch.cuda.empty_cache()
    source = (
        f"python -m moelora.kernels.tools.tune, {time.strftime('%Y-%m-%d', time.gmtime())}, torch {torch.__version__}"
        f", timing {'CUDA graphs' if cuda else 'wall clock (Triton interpreter: not a performance figure)'}"
    )
    files = write_outputs(out_dir=out_dir, state=state, device_name=device_name, source=source)
    return {"measured": done, "skipped": skipped, "files": [str(f) for f in files]}


def report(state: dict) -> str:
    """Markdown table of every measured bucket: tuned vs default time of one op call."""
    lines = [
        ("| kernel | model | op | rank | max_loras | M | default µs | tuned µs | speed-up | candidates (rejected) |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    recs = sorted(
        state["buckets"].values(),
        key=lambda r: (
            r["bucket"]["model"],
            r["kernel"],
            r["bucket"]["op"],
            r["bucket"]["rank"],
            r["bucket"]["max_loras"],
            r["bucket"]["m"],
        ),
    )
    for r in recs:
        b, res = r["bucket"], r["result"]
        d, us = res["default_us"], res["us"]
        default, gain = ("-", "-") if d is None else (f"{d:.1f}", f"{d / us:.2f}x")
        lines.append(
            f"| {r['kernel']} | {b['model']} | {b['op']} | {b['rank']} | {b['max_loras']} | {b['m']} | "
            f"{default} | {us:.1f} | {gain} | {res['measured']} ({res['rejected']}) |"
        )
    return "\n".join(lines)


def _ints(s: str) -> list[int]:
    try:
        return [int(v) for v in s.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {s!r}") from None


def main(argv: list[str] | None = None, *, stand_in_op: Callable[..., None] | None = None) -> int:
    """The command line. stand_in_op: an op with the signature of vLLM's _fused_moe_lora, timed in place of vLLM's
    own when --vllm-op stand-in is given (the CPU pipeline test passes the moelora plugin's torch op); the tools
    import the kernels, never the plugin above them."""
    p = argparse.ArgumentParser(
        prog="python -m moelora.kernels.tools.tune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        action="append",
        choices=sorted(MODEL_PRESETS),
        help="preset model shape (repeatable); or give --hidden/--intermediate/--experts/--top-k",
    )
    p.add_argument("--hidden", type=int)
    p.add_argument("--intermediate", type=int)
    p.add_argument("--experts", type=int)
    p.add_argument("--top-k", type=int)
    p.add_argument("--w13-slices", type=int, choices=(1, 2), default=2, help="for an explicit shape (default 2)")
    p.add_argument("--ranks", type=_ints, default=[16, 32, 64])
    p.add_argument("--max-loras", type=_ints, default=[1, 4, 8])
    p.add_argument("--m", type=_ints, default=list(DEFAULT_M), help="token-count buckets")
    p.add_argument("--space", choices=sorted(SPACES), default=None, help="default: h200 on a GPU, tiny on the CPU")
    p.add_argument("--passes", type=int, default=2, help="coordinate-descent passes per bucket (default 2)")
    p.add_argument("--kernels", default="ours,vllm", help="comma list of ours,vllm")
    p.add_argument(
        "--vllm-op",
        choices=("auto", "stand-in"),
        default="auto",
        help="auto: vLLM's own op where it can run (CUDA), else no vLLM files; stand-in: the op a Python caller "
        "passed as main(stand_in_op=...) (CPU pipeline test only)",
    )
    p.add_argument("--device-name", help="GPU name for the file names (default torch.cuda.get_device_name())")
    p.add_argument("--output", "-o", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument(
        "--report",
        action="store_true",
        help="print the state's tuned-vs-default table (markdown, for docs/benchmarks.md) and exit",
    )
    args = p.parse_args(argv)
    if args.report:
        print(report(load_state(args.output / STATE_FILE)))
        return 0

    models = [MODEL_PRESETS[m] for m in args.model or []]
    explicit = (args.hidden, args.intermediate, args.experts, args.top_k)
    if any(v is not None for v in explicit):
        if any(v is None or v <= 0 for v in explicit):
            p.error("an explicit shape needs positive --hidden, --intermediate, --experts and --top-k")
        models.append(
            ModelShape(
                f"h{args.hidden}-i{args.intermediate}-e{args.experts}-k{args.top_k}",
                args.hidden,
                args.intermediate,
                args.experts,
                args.top_k,
                args.w13_slices,
            )
        )
    if not models:
        p.error("give --model or an explicit shape")
    if any(r < 1 or r > 128 for r in args.ranks) or any(v < 1 for v in args.max_loras + args.m):
        p.error("ranks must be 1..128, max_loras and m positive")
    if args.passes < 1:
        p.error("--passes must be at least 1")
    kernels = [k for k in args.kernels.split(",") if k]
    if not set(kernels) <= {"ours", "vllm"}:
        p.error("--kernels takes ours and/or vllm")

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    device_name = args.device_name or (torch.cuda.get_device_name() if cuda else "cpu")
    space = SPACES[args.space or ("h200" if cuda else "tiny")]
    vllm, why = (None, "not asked")
    if "vllm" in kernels:
        if args.vllm_op == "stand-in":
            if stand_in_op is None:
                p.error("--vllm-op stand-in needs a caller that passes main(stand_in_op=...)")
            vllm, why = stand_in_op, "a stand-in op given by the caller (NOT vLLM's kernel)"
        else:
            vllm, why = vllm_op()
    buckets = plan(models=models, ranks=args.ranks, max_loras=args.max_loras, ms=args.m, kernels=kernels)
    state = load_state(args.output / STATE_FILE)
    todo = [b for b in buckets if b.key not in state["buckets"] and (b.kernel == "ours" or vllm is not None)]
    per_bucket = {k: 1 + sum(len(v) - 1 for v in space[k].values()) for k in kernels}
    print(
        f"# tune on {device_name} ({device.type}); timing: "
        f"{'CUDA graphs' if cuda else 'wall clock, Triton interpreter (pipeline check, not performance)'}"
    )
    print(f"# vLLM op: {why}; prefix {gpu_prefix(device_name)}; output {args.output}")
    print(
        f"# {len(buckets)} buckets, {len(todo)} to measure; one descent pass ~ "
        f"{sum(per_bucket[b.kernel] for b in todo)} candidates"
        + (" (later passes only where the previous one improved)" if args.passes > 1 else "")
    )
    if args.dry_run:
        for b in todo:
            print(f"  {b.key}")
        return 0
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton picks compiled-or-interpreted when the kernels are defined (at import), so it cannot be switched here.
        print("no CUDA device: run with TRITON_INTERPRET=1 to tune in Triton's interpreter", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if cuda else torch.float32
    t0 = time.monotonic()
    res = tune(
        buckets=buckets,
        out_dir=args.output,
        space=space,
        device=device,
        device_name=device_name,
        vllm=vllm,
        dtype=dtype,
        log=lambda msg: print(msg, flush=True),
        passes=args.passes,
    )
    print(f"# measured {res['measured']} buckets, skipped {res['skipped']} done before, {time.monotonic() - t0:.0f} s")
    for f in res["files"]:
        print(f"# wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
