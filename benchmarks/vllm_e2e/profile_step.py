"""Where a decode step's GPU time goes, and each prefill step's, from vLLM's torch-profiler trace (serve_passes.sh with
PROFILE=1).

    python3 benchmarks/vllm_e2e/profile_step.py TRACE_OR_DIR [--json FILE]

Steps begin at the worker's step annotations (vLLM 0.26: execute_context_<requests>(<tokens>)_generation_...; older
releases: "gpu_model_runner: preprocess"): each GPU kernel belongs to the step in which its launch (cudaLaunchKernel,
or the cudaGraphLaunch that replayed it, matched by correlation id) was made. Decode steps are the most common label
of a batch without prefill (else the most common kernel count), with its most common kernel count; each
figure is their mean. "sum" adds every kernel's duration, "busy" is the union of their intervals (sum - busy: time
two kernels ran at once); the main stream carries the most kernel time, and a kernel's "beside" part is where a
kernel of another stream ran at the same time (vLLM's dual LoRA stream overlapping the base model). Under the
profiler each kernel starts later than it would (its tracing), so the span overstates a served step; the kernel
times do not. Then one row per step with prompt tokens (vLLM 0.26's labels only): its kernel time by kind, LoRA's
summed, so a LoRA server's slower time to first token can be traced to the kernels of its prefill steps.
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
    ("dense LoRA (moelora split K)", r"_dense_splitk_kernel"),
    ("dense LoRA shrink", r"_lora_shrink_kernel"),
    ("dense LoRA expand", r"_lora_expand_kernel"),
    ("MoE-LoRA (moelora)", r"_shrink_kernel|_expand_kernel|_route_\w*kernel|_onepass_kernel|_scatter_block_experts"),
    ("MoE-LoRA (vLLM)", r"moe_lora|fused_moe_lora"),
    ("base MoE GEMMs", r"fused_moe_kernel"),
    ("base MoE other", r"moe_align|topk|count_and_sort|moe_sum|act_and_mul|swiglu|silu|gating"),
    ("attention", r"flash|attn|attention|fmha|reshape_and_cache|concat_and_cache|paged"),
    ("dense GEMMs", r"nvjet|gemm|cutlass|xmma|cublas|splitk|sm90_"),
    ("zero fills", r"FillFunctor"),
    ("elementwise adds", r"CUDAFunctor_add"),
)
# vLLM 0.26 annotates each step as execute_context_<reqs>(<tokens>)_generation_<reqs>(<tokens>); older releases
# marked the runner's phases, the first of which starts a step.
STEP_LABEL = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
MOE_LORA = ("MoE-LoRA (moelora)", "MoE-LoRA (vLLM)")
LORA = ("dense LoRA (moelora split K)", "dense LoRA shrink", "dense LoRA expand", *MOE_LORA)
# Prefill columns: kernel time of each kind, in ms.
PREFILL_KINDS = ("base MoE GEMMs", "attention", "dense GEMMs")
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


def steps_of(events: list[dict]) -> list[tuple[str, list[dict]]]:
    """(label, kernels) per step: a kernel belongs to the step whose host-side mark precedes its launch."""
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    marks = sorted((e["ts"], e["name"]) for e in cpu if STEP_LABEL.match(e.get("name", "")))
    if not marks:
        names = {e.get("name") for e in events if e.get("ph") == "X"}
        mark = next((m for m in STEP_MARKS if m in names), None)
        marks = sorted((e["ts"], "") for e in events if e.get("name") == mark and e.get("ph") == "X")
    starts = [ts for ts, _ in marks]
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
        i = bisect.bisect_right(starts, launched) - 1
        if i >= 0:
            steps[i].append(e)
    return [(label, s) for (_, label), s in zip(marks, steps) if s]


NO_WAIT = "nothing ended in the gap (launch gaps, the profiler)"


def main_waits(main_kernels: list[dict], side_kernels: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """The main stream's gaps between two of its kernels, by category and by name of the other stream's kernel that
    ended last inside the gap (the one an event wait held it for), with its launch grid where the trace has one (one
    kernel serves layers of several shapes: q/k/v and o); a gap where none ended is NO_WAIT's."""
    by_cat: dict[str, float] = collections.Counter()
    by_name: dict[str, float] = collections.Counter()
    ends = sorted((k["ts"] + k["dur"], k["name"], k.get("args", {}).get("grid")) for k in side_kernels)
    keys = [end for end, _, _ in ends]
    ordered = sorted(main_kernels, key=lambda k: k["ts"])
    for before, after in zip(ordered, ordered[1:]):
        gap_start, gap_end = before["ts"] + before["dur"], after["ts"]
        if gap_end <= gap_start:
            continue
        i = bisect.bisect_right(keys, gap_end) - 1
        if i >= 0 and keys[i] > gap_start:
            _, name, grid = ends[i]
            by_cat[category(name)] += gap_end - gap_start
            by_name[name[:90] + ("" if grid is None else f" {list(grid)}")] += gap_end - gap_start
        else:
            by_cat[NO_WAIT] += gap_end - gap_start
    return dict(by_cat), dict(by_name)


def step_figures(kernels: list[dict]) -> dict:
    by_cat: dict[str, float] = collections.Counter()
    by_name: dict[str, float] = collections.Counter()
    on_side: dict[str, float] = collections.Counter()
    hidden: dict[str, float] = collections.Counter()
    spans = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
    per_stream: dict[object, list[tuple[float, float]]] = collections.defaultdict(list)
    for k in kernels:
        per_stream[k.get("args", {}).get("stream")].append((k["ts"], k["ts"] + k["dur"]))
    # The main stream carries the most kernel time; the rest (vLLM's LoRA stream) may run beside it.
    main = max(per_stream, key=lambda st: sum(e - s for s, e in per_stream[st]))
    merged = {st: union(iv) for st, iv in per_stream.items()}
    beside = {st: union([iv for other, m in merged.items() if other != st for iv in m]) for st in merged}
    for k in kernels:
        cat, stream = category(k["name"]), k.get("args", {}).get("stream")
        by_cat[cat] += k["dur"]
        by_name[k["name"][:90]] += k["dur"]
        if stream != main:
            on_side[cat] += k["dur"]
        hidden[cat] += intersect((k["ts"], k["ts"] + k["dur"]), beside[stream])
    busy = length(union(spans))
    waits, waits_by_name = main_waits(
        [k for k in kernels if k.get("args", {}).get("stream") == main],
        [k for k in kernels if k.get("args", {}).get("stream") != main],
    )
    return {
        "span": max(e for _, e in spans) - min(s for s, _ in spans),
        "sum": sum(k["dur"] for k in kernels),
        "busy": busy,
        "main_busy": length(merged[main]),
        "kernels": len(kernels),
        "streams": len(per_stream),
        "by_cat": dict(by_cat),
        "on_side": dict(on_side),
        "hidden": dict(hidden),
        "by_name": dict(by_name),
        "waits": waits,
        "waits_by_name": waits_by_name,
    }


def prefill_steps(steps: list[tuple[str, list[dict]]]) -> list[dict]:
    """Each step with prompt tokens: its requests and tokens, and its kernel time (ms) by kind, LoRA's summed."""
    rows = []
    for label, kernels in steps:
        m = STEP_LABEL.match(label)
        if m is None or int(m.group(2)) == 0:
            continue
        f = step_figures(kernels)
        by_cat = f["by_cat"]
        rows.append(
            {
                "prompts": int(m.group(1)),
                "prompt_tokens": int(m.group(2)),
                "decodes": int(m.group(3)),
                "kernels": f["kernels"],
                "span_ms": f["span"] / 1000,
                "busy_ms": f["busy"] / 1000,
                "lora_ms": sum(by_cat.get(c, 0.0) for c in LORA) / 1000,
                "lora_beside_ms": sum(f["hidden"].get(c, 0.0) for c in LORA) / 1000,
                **{kind: by_cat.get(kind, 0.0) / 1000 for kind in PREFILL_KINDS},
                "moe_lora_ms": sum(by_cat.get(c, 0.0) for c in MOE_LORA) / 1000,
            }
        )
    return rows


def print_prefill(rows: list[dict]) -> None:
    if not rows:
        print("\nno step with prompt tokens (or a vLLM without step labels)")
        return
    print("\nsteps with prompt tokens, ms (kernel time by kind; LoRA: every LoRA kernel, of it MoE-LoRA and the part")
    print("beside another stream's kernel)\n")
    kinds = " | ".join(PREFILL_KINDS)
    print(f"| prompts (tokens) + decodes | kernels | span | busy | LoRA | of it MoE-LoRA | beside | {kinds} |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(PREFILL_KINDS))
    for r in rows:
        cells = " | ".join(f"{r[kind]:.2f}" for kind in PREFILL_KINDS)
        print(
            f"| {r['prompts']} ({r['prompt_tokens']}) + {r['decodes']} | {r['kernels']} | {r['span_ms']:.2f} | "
            f"{r['busy_ms']:.2f} | {r['lora_ms']:.2f} | {r['moe_lora_ms']:.2f} | {r['lora_beside_ms']:.2f} | "
            f"{cells} |"
        )


def print_waits(waits: dict[str, float], by_name: dict[str, float], top: int) -> None:
    """The decode step's main-stream gaps by what ended in them (main_waits)."""
    print(f"\nthe main stream's gaps in a decode step, µs ({sum(waits.values()):.0f} in all), by the other stream's")
    print("kernel that ended last inside each (what the main stream waited for)\n")
    print("| waited for | µs per step |")
    print("|---|---|")
    for label, us in sorted(waits.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {us:.0f} |")
    print()
    print_kernels("kernel waited for (its grid)", by_name, top)


def print_kernels(heading: str, by_name: dict[str, float], top: int) -> None:
    """The `top` kernels by µs per step, with their categories."""
    print(f"| {heading} | category | µs per step |")
    print("|---|---|---|")
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| `{name}` | {category(name)} | {us:.1f} |")


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
    # Decode steps: the most common label without prefill (a steady batch), else the most common kernel count.
    labels = collections.Counter(label for label, _ in steps if label.startswith("execute_context_0(0)"))
    decode = labels.most_common(1)[0][0] if labels else None
    counts = collections.Counter(len(s) for label, s in steps if decode is None or label == decode)
    modal = counts.most_common(1)[0][0]
    figs = [step_figures(s) for label, s in steps if (decode is None or label == decode) and len(s) == modal]
    mean = {k: statistics.fmean(f[k] for f in figs) for k in ("span", "sum", "busy", "main_busy", "kernels", "streams")}
    cats, side, hidden = mean_of(figs, "by_cat"), mean_of(figs, "on_side"), mean_of(figs, "hidden")
    names = mean_of(figs, "by_name")
    waits, waits_by_name = mean_of(figs, "waits"), mean_of(figs, "waits_by_name")
    print(
        f"{len(steps)} steps; {len(figs)} decode steps ({decode or 'by kernel count'}) of {modal} kernels "
        f"(their other kernel counts: {dict(sorted((k, v) for k, v in counts.items() if k != modal))})"
    )
    median_span = statistics.median(f["span"] for f in figs)
    print(f"\nper decode step, µs (mean of {len(figs)}; median span {median_span:.0f})\n")
    print("| what | µs | of which off the main stream | of which beside another stream's kernel |")
    print("|---|---|---|---|")
    print(f"| GPU span (first kernel start to last kernel end) | {mean['span']:.0f} | | |")
    print(f"| GPU busy (union of kernel intervals) | {mean['busy']:.0f} | | |")
    print(f"| main stream busy | {mean['main_busy']:.0f} | | |")
    print(f"| idle inside the span (launch gaps, profiler) | {mean['span'] - mean['busy']:.0f} | | |")
    print(f"| kernel time summed | {mean['sum']:.0f} | {sum(side.values()):.0f} | {sum(hidden.values()):.0f} |")
    for label, _ in (*CATEGORIES, ("other", "")):
        if cats.get(label):
            print(f"| {label} | {cats[label]:.0f} | {side.get(label, 0.0):.0f} | {hidden.get(label, 0.0):.0f} |")
    print(f"\nkernels per step {mean['kernels']:.0f}, streams per step {mean['streams']:.1f}\n")
    print_kernels("kernel", names, args.top)
    print_waits(waits, waits_by_name, args.top)
    prefill = prefill_steps(steps)
    print_prefill(prefill)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "steps": len(steps),
                    "decode_steps": len(figs),
                    "modal_kernels": modal,
                    "mean": mean,
                    "by_cat": cats,
                    "on_side": side,
                    "hidden": hidden,
                    "by_name": names,
                    "waits": waits,
                    "waits_by_name": waits_by_name,
                    "prefill": prefill,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
