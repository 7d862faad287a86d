"""Merge a tuner run's configs/<GPU>.json into the bundled one: a tuned entry replaces the bundled entry with the
same (k, n, num_experts, rank, max_loras, m, route); every other bundled entry stays. Both files are read, and the
result written, through the table's schema (moelora.api.kernel_table), so a malformed input is refused by name.

    .venv/bin/python kernels/scripts/merge_configs.py OUTPUT_DIR/tune/configs/NVIDIA_H200.json \
        kernels/moelora/kernels/configs/NVIDIA_H200.json
"""

import sys
from pathlib import Path

from moelora.api.kernel_table import KernelTable


def main(tuned_path: str, bundled_path: str) -> None:
    tuned = KernelTable.parse(Path(tuned_path).read_bytes(), origin=tuned_path)
    bundled = KernelTable.parse(Path(bundled_path).read_bytes(), origin=bundled_path)
    merged = {e.key(): e for e in bundled.entries}
    replaced = sum(e.key() in merged for e in tuned.entries)
    merged.update({e.key(): e for e in tuned.entries})
    out = KernelTable(
        device=bundled.device,
        source=f"{bundled.source}; merged: {tuned.source}",
        entries=tuple(merged[k] for k in sorted(merged)),
    )
    Path(bundled_path).write_text(out.dump())
    print(f"{len(tuned.entries)} tuned entries ({replaced} replaced), {len(out.entries)} in {bundled_path}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
