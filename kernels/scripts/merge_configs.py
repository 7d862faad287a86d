"""Merge a tuner run's configs/<GPU>.json into the bundled one: a tuned entry replaces the bundled entry with the
same (k, n, num_experts, rank, max_loras, m, route); every other bundled entry stays.

    python3 kernels/scripts/merge_configs.py OUTPUT_DIR/tune/configs/NVIDIA_H200.json \
        kernels/moelora/kernels/configs/NVIDIA_H200.json
"""

import json
import sys
from pathlib import Path


def key(e: dict) -> tuple:
    return e["k"], e["n"], e["num_experts"], e["rank"], e["max_loras"], e["m"], e.get("route", "grouped")


def main(tuned_path: str, bundled_path: str) -> None:
    tuned, bundled = json.loads(Path(tuned_path).read_text()), json.loads(Path(bundled_path).read_text())
    merged = {key(e): e for e in bundled["entries"]}
    replaced = sum(key(e) in merged for e in tuned["entries"])
    merged.update({key(e): e for e in tuned["entries"]})
    out = {
        "device": bundled["device"],
        "source": f"{bundled['source']}; merged: {tuned['source']}",
        "entries": [merged[k] for k in sorted(merged)],
    }
    Path(bundled_path).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(tuned['entries'])} tuned entries ({replaced} replaced), {len(out['entries'])} in {bundled_path}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
