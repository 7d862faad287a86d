"""Where a decode step's GPU time goes, from vLLM's torch-profiler trace (serve_passes.sh with PROFILE=1).

    python3 benchmarks/vllm_e2e/profile_step.py TRACE_OR_DIR [--json FILE]

Steps begin at the worker's "gpu_model_runner: preprocess" annotations: each GPU kernel belongs to the step in which its
launch (cudaLaunchKernel, or the cudaGraphLaunch that replayed it, matched by correlation id) was made. Decode steps
are the steps with the most common kernel count (a steady batch replays one graph, so its kernel list repeats); each
figure is their mean. Overlap is read from timestamps alone, not stream ids (a replayed graph's branches run on
streams of CUDA's choosing): "sum" adds every kernel's duration, "busy" is the union of their intervals, so sum -
busy is time two kernels ran at once, and a LoRA kernel's "hidden" part is where it ran beside a non-LoRA kernel.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import pathlib
import re
import statistics
import sys

# First match wins: vLLM's dense LoRA kernels are named *_shrink_kernel / *_expand_kernel too.
CATEGORIES = (
    ("dense LoRA shrink", r"_lora_shrink_kernel"),
    ("dense LoRA expand", r"_lora_expand_kernel"),
    ("MoE-LoRA (moelora)", r"_shrink_kernel|_expand_kernel|_route_\w*kernel|_onepass_kernel|_scatter_block_experts"),
    ("MoE-LoRA (vLLM)", r"moe_lora|fused_moe_lora"),
    ("base MoE GEMMs", r"fused_moe_kernel"),
    ("base MoE other", r"moe_align|topk|count_and_sort|moe_sum|act_and_mul|swiglu|silu|gating"),
    ("attention", r"flash|attn|attention|fmha|reshape_and_cache|concat_and_cache|paged"),
    ("dense GEMMs", r"nvjet|gemm|cutlass|xmma|cublas|splitk|sm90_"),
)
LORA = ("dense LoRA shrink", "dense LoRA expand", "MoE-LoRA (moelora)", "MoE-LoRA (vLLM)")
# The first of these annotations the trace holds marks each step's start.
STEP_MARKS = ("gpu_model_runner: preprocess", "gpu_model_runner: forward", "execute_model")


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def load(path: pathlib.Path) -> list[dict]:
    traces = sorted(path.rglob("*.pt.trace.json*")) if path.is_dir() else [path]
    if not traces:
        raise SystemExit(f"no trace under {path}")
    # vLLM writes one trace per worker rank; the biggest is the rank with the GPU work (one GPU here).
    trace = max(traces, key=lambda f: f.stat().st_size)
    opener = gzip.open if trace.name.endswith(".gz") else open
    with opener(trace, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a: tuple[float, float], merged: list[tuple[float, float]]) -> float:
    """Length of interval a inside the merged (sorted, disjoint) intervals."""
    total, i = 0.0, max(0, bisect.bisect_left(merged, (a[0], a[0])) - 1)
    while i < len(merged) and merged[i][0] < a[1]:
        total += max(0.0, min(a[1], merged[i][1]) - max(a[0], merged[i][0]))
        i += 1
    return total


def steps_of(events: list[dict]) -> list[list[dict]]:
    names = {e.get("name") for e in events if e.get("ph") == "X"}
    mark = next((m for m in STEP_MARKS if m in names), None)
    marks = sorted(e["ts"] for e in events if e.get("name") == mark and e.get("ph") == "X")
    launches = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e["ts"]
    steps: list[list[dict]] = [[] for _ in marks]
    for e in events:
        if e.get("cat") != "kernel" or e.get("ph") != "X":
            continue
        launched = launches.get(e.get("args", {}).get("correlation"))
        if launched is None or not marks:
            continue
        i = bisect.bisect_right(marks, launched) - 1
        if i >= 0:
            steps[i].append(e)
    return [s for s in steps if s]


def step_figures(kernels: list[dict]) -> dict:
    by_cat: dict[str, float] = collections.Counter()
    by_name: dict[str, float] = collections.Counter()
    spans = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
    for k in kernels:
        by_cat[category(k["name"])] += k["dur"]
        by_name[k["name"][:90]] += k["dur"]
    other = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if category(k["name"]) not in LORA])
    hidden: dict[str, float] = collections.Counter()
    for k in kernels:
        cat = category(k["name"])
        if cat in LORA:
            hidden[cat] += intersect((k["ts"], k["ts"] + k["dur"]), other)
    busy = length(union(spans))
    return {
        "span": max(e for _, e in spans) - min(s for s, _ in spans),
        "sum": sum(k["dur"] for k in kernels),
        "busy": busy,
        "kernels": len(kernels),
        "streams": len({k.get("args", {}).get("stream") for k in kernels}),
        "by_cat": dict(by_cat),
        "hidden": dict(hidden),
        "by_name": dict(by_name),
    }


def mean_of(figs: list[dict], key: str) -> dict[str, float]:
    names = {n for f in figs for n in f[key]}
    return {n: statistics.fmean(f[key].get(n, 0.0) for f in figs) for n in names}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=pathlib.Path, help="a .pt.trace.json(.gz) or the profiler's folder")
    p.add_argument("--json", type=pathlib.Path, help="write the figures here")
    p.add_argument("--top", type=int, default=25, help="kernels listed by name")
    args = p.parse_args(argv)
    events = load(args.trace)
    steps = steps_of(events)
    if not steps:
        print(f"no steps: none of {STEP_MARKS} annotated, or no kernel launched inside one", file=sys.stderr)
        return 1
    counts = collections.Counter(len(s) for s in steps)
    modal = counts.most_common(1)[0][0]
    figs = [step_figures(s) for s in steps if len(s) == modal]
    mean = {k: statistics.fmean(f[k] for f in figs) for k in ("span", "sum", "busy", "kernels", "streams")}
    cats, hidden, names = mean_of(figs, "by_cat"), mean_of(figs, "hidden"), mean_of(figs, "by_name")
    print(
        f"{len(steps)} steps; {len(figs)} decode steps of {modal} kernels (other step sizes: "
        f"{dict(sorted((k, v) for k, v in counts.items() if k != modal))})"
    )
    print(
        f"\nper decode step, µs (mean of {len(figs)}; median span {statistics.median(f['span'] for f in figs):.0f})\n"
    )
    print("| what | µs | of which beside a non-LoRA kernel |")
    print("|---|---|---|")
    print(f"| GPU span (first kernel start to last kernel end) | {mean['span']:.0f} | |")
    print(f"| GPU busy (union of kernel intervals) | {mean['busy']:.0f} | |")
    print(f"| idle inside the span (launch gaps, host waits) | {mean['span'] - mean['busy']:.0f} | |")
    print(f"| kernel time summed | {mean['sum']:.0f} | |")
    print(f"| run concurrently (sum - busy) | {mean['sum'] - mean['busy']:.0f} | |")
    for label, _ in (*CATEGORIES, ("other", "")):
        if cats.get(label):
            h = f"{hidden.get(label, 0.0):.0f}" if label in LORA else ""
            print(f"| {label} | {cats[label]:.0f} | {h} |")
    print(f"\nkernels per step {mean['kernels']:.0f}, distinct stream ids per step {mean['streams']:.1f}\n")
    print("| kernel | category | µs per step |")
    print("|---|---|---|")
    for name, us in sorted(names.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| `{name}` | {category(name)} | {us:.1f} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "steps": len(steps),
                    "decode_steps": len(figs),
                    "modal_kernels": modal,
                    "mean": mean,
                    "by_cat": cats,
                    "hidden": hidden,
                    "by_name": names,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
