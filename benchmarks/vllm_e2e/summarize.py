"""Table of the end-to-end runs under OUT (one folder per run, each with vLLM's bench_*.json and the server log).
Usage: python summarize.py OUT"""

import json
import pathlib
import re
import sys

out = pathlib.Path(sys.argv[1])
print(
    "| run | output tok/s | median TPOT ms | median TTFT ms | mean TTFT ms | p99 TTFT ms | kernel lines in server log |"
)
print("|---|---|---|---|---|---|---|")
for run in ("stock", "tuned", "plugin"):
    benches = sorted((out / run).glob("bench_*.json"))
    if not benches:
        continue
    r = json.loads(benches[0].read_text())
    logs = sorted((out / run).glob("server_*.log"))
    text = logs[0].read_text(errors="replace") if logs else ""
    lines = sorted({m.group(0).strip() for m in re.finditer(r"moelora:[^\n]*|Using [^\n]*MoE[^\n]*", text)})
    print(
        f"| {run} | {r['output_throughput']:.0f} | {r['median_tpot_ms']:.2f} | {r['median_ttft_ms']:.0f} | "
        f"{r['mean_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} | {'; '.join(lines)[:300]} |"
    )
