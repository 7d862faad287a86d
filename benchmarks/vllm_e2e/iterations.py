"""Where a served benchmark's time went, step by step, from vLLM's own per-step lines (serve_passes.sh keeps them in
iterations.txt: `--enable-logging-iteration-details`, on by default there).

    python3 benchmarks/vllm_e2e/iterations.py SERVER_DIR... [--json FILE]

With 16 requests of 1600 prompt tokens and 600 output tokens, the time to first token is a few chunked prefill steps
and the time per output token is a decode step plus the prefill steps that stall a request while it decodes. The
profiler's step breakdown (profile_step.py) slows every kernel launch; these are the engine's own timings of every
step served, so they split the end-to-end gap between the two kinds of step. One row per server: decode steps (no
prompt tokens; median, and the mean of the most common batch size), steps with prompt tokens (how many, their median,
the prompt tokens they carry, milliseconds per 1000 of them) and the share of the served time in each. Where the
server's folder has pass_steps.txt (serve_passes.sh: each pass's name and the steps logged by its end), one row per
pass instead, so a base-model pass (BASE_PASS) is not averaged into the adapters' pass.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import statistics
import sys

LINE = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
    r"(\d+) generation tokens, iteration elapsed time: ([0-9.]+)"
)


def read(path: pathlib.Path) -> list[tuple[int, int, int, float]]:
    """(context requests, context tokens, generation requests, elapsed ms) per step, in the order logged."""
    steps = []
    for line in path.read_text(errors="replace").splitlines():
        if m := LINE.search(line):
            steps.append((int(m.group(2)), int(m.group(3)), int(m.group(4)), float(m.group(6))))
    return steps


def by_pass(steps: list, marks: pathlib.Path) -> dict[str, list]:
    """The steps cut at each pass's end (`name count` lines, counts ascending); what was logged before a pass's
    start (the server's own warm-up, an earlier pass's tail) goes with that pass."""
    out, start = {}, 0
    for line in marks.read_text().splitlines():
        name, _, count = line.partition(" ")
        end = min(int(count), len(steps))
        out[name] = steps[start:end]
        start = end
    return out


def figures(steps: list[tuple[int, int, int, float]]) -> dict:
    decode = [(gen, ms) for ctx_reqs, ctx_tokens, gen, ms in steps if ctx_tokens == 0 and gen > 0]
    prefill = [(ctx_tokens, ms) for _, ctx_tokens, _, ms in steps if ctx_tokens > 0]
    total = sum(ms for *_, ms in steps)
    modal = collections.Counter(gen for gen, _ in decode).most_common(1)[0][0] if decode else 0
    prompt_tokens = sum(tokens for tokens, _ in prefill)
    prefill_ms = sum(ms for _, ms in prefill)
    return {
        "steps": len(steps),
        "decode_steps": len(decode),
        "decode_median_ms": statistics.median(ms for _, ms in decode) if decode else 0.0,
        "decode_batch": modal,
        "decode_batch_mean_ms": statistics.fmean(ms for gen, ms in decode if gen == modal) if decode else 0.0,
        "prefill_steps": len(prefill),
        "prefill_median_ms": statistics.median(ms for _, ms in prefill) if prefill else 0.0,
        "prefill_tokens_per_step": prompt_tokens / len(prefill) if prefill else 0.0,
        "prefill_ms_per_1000_tokens": 1000 * prefill_ms / prompt_tokens if prompt_tokens else 0.0,
        "decode_share": sum(ms for _, ms in decode) / total if total else 0.0,
        "prefill_share": prefill_ms / total if total else 0.0,
        "served_s": total / 1000,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=pathlib.Path, help="serve_passes.sh server folders (iterations.txt)")
    p.add_argument("--json", type=pathlib.Path, help="write the figures here")
    args = p.parse_args(argv)
    rows = {}
    for d in args.dirs:
        path = d / "iterations.txt" if d.is_dir() else d
        steps = read(path) if path.exists() else []
        marks = d / "pass_steps.txt"
        parts = by_pass(steps, marks) if d.is_dir() and marks.exists() else {"": steps}
        for name, part in parts.items():
            if part:
                rows[f"{d.name} {name}".strip()] = figures(part)
        if not steps:
            print(f"{d.name}: no per-step lines", file=sys.stderr)
    if not rows:
        return 1
    print(
        "| server | steps | decode steps | decode median ms | batch | its mean ms | steps with prompts "
        "| their median ms | prompt tokens a step | ms per 1000 prompt tokens | time in decode / prefill steps "
        "| served s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, f in rows.items():
        print(
            f"| {name} | {f['steps']} | {f['decode_steps']} | {f['decode_median_ms']:.2f} | {f['decode_batch']} | "
            f"{f['decode_batch_mean_ms']:.2f} | {f['prefill_steps']} | {f['prefill_median_ms']:.1f} | "
            f"{f['prefill_tokens_per_step']:.0f} | {f['prefill_ms_per_1000_tokens']:.1f} | "
            f"{100 * f['decode_share']:.0f}% / {100 * f['prefill_share']:.0f}% | {f['served_s']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
