"""Where a vLLM server's start-up went: seconds from launch to each phase's end, from its log's timestamps.
Usage: python startup.py SERVER_DIR...   (each a serve_passes.sh folder: server.log[.gz], launched_at.txt, ready_s.txt,
and adapters_s.txt where its adapters were loaded through the runtime API: ADAPTERS=runtime)
The log's clock has whole seconds; the plugin's warm-ups also report their own durations."""

from __future__ import annotations

import gzip
import pathlib
import re
import sys

# (label, pattern): a phase ends at the first line matching its pattern (the last one for the repeated ones).
PHASES = [
    ("API server's first line", r"^\(APIServer|^INFO|^WARNING"),
    ("engine process started", r"^\(EngineCore"),
    ("weights: loading starts", r"Starting to load model"),
    ("weights loaded", r"Model loading took"),
    ("torch.compile done", r"torch\.compile took"),
    ("profile run done", r"Initial profiling/warmup run took"),
    ("KV cache sized", r"Available KV cache memory|GPU KV cache size"),
    ("dense LoRA warm-up done (last op)", r"moelora: vLLM's lora_(shrink|expand) for"),
    ("MoE-LoRA warm-up done", r"moelora: MoE-LoRA kernels compiled"),
    ("model warm-up done", r"moelora: model warm-up ran"),
    ("graph capture done", r"Graph capturing finished"),
    ("engine init done", r"init engine .* took"),
    ("API server ready", r"Application startup complete"),
]
REPEATED = {"dense LoRA warm-up done (last op)"}
STAMP = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
SECONDS = re.compile(r" in ([0-9.]+) s|took ([0-9.]+) s|finished in ([0-9.]+) secs")


def read(path: pathlib.Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        return f.read().splitlines()


def clock(line: str) -> int | None:
    m = STAMP.search(line)
    return None if m is None else int(m[3]) * 3600 + int(m[4]) * 60 + int(m[5])


def phases(lines: list[str], launched: int) -> list[tuple[str, int, str]]:
    """(label, seconds after launch, the duration the line itself reports or '') in the log's order."""
    found: dict[str, tuple[int, str]] = {}
    for line in lines:
        t = clock(line)
        if t is None:
            continue
        for label, pattern in PHASES:
            if re.search(pattern, line) and (label not in found or label in REPEATED):
                own = SECONDS.search(line)
                reported = next((g for g in own.groups() if g), "") if own else ""
                if label in REPEATED and label in found:
                    reported = f"{float(found[label][1] or 0) + float(reported or 0):.1f}"
                found[label] = ((t - launched) % 86400, reported)
    return sorted(((label, *found[label]) for label, _ in PHASES if label in found), key=lambda r: r[1])


def compiles(lines: list[str], launched: int) -> str:
    """Triton compiles the plugin logged (MOELORA_LOG_COMPILES=1): how many, over which seconds, and after ready."""
    ready = next((clock(x) for x in lines if "Application startup complete" in x), None)
    times = [clock(x) for x in lines if "moelora: Triton compiled" in x]
    times = [t for t in times if t is not None]
    if not times:
        return "no Triton compiles logged"
    late = sum(1 for t in times if ready is not None and t > ready)
    return (
        f"{len(times)} Triton compiles logged, {(times[0] - launched) % 86400}..{(times[-1] - launched) % 86400} s "
        f"after launch, {late} after ready"
    )


def main(dirs: list[str]) -> None:
    for d in map(pathlib.Path, dirs):
        logs = [p for p in (d / "server.log", d / "server.log.gz") if p.exists()]
        if not logs or not (d / "launched_at.txt").exists():
            print(f"{d.name}: no log or launch time")
            continue
        h, m, s = map(int, (d / "launched_at.txt").read_text().split(":"))
        launched, lines = h * 3600 + m * 60 + s, read(logs[0])
        ready = (d / "ready_s.txt").read_text().strip() if (d / "ready_s.txt").exists() else "-"
        loaded = d / "adapters_s.txt"
        after = f"; last adapter in after {loaded.read_text().strip()} s" if loaded.exists() else ""
        print(f"\n{d.name}: ready after {ready} s{after}; {compiles(lines, launched)}")
        print("| phase ends | s after launch | step s | reported s |\n|---|---|---|---|")
        last = 0
        for label, t, reported in phases(lines, launched):
            print(f"| {label} | {t} | {t - last} | {reported} |")
            last = t


if __name__ == "__main__":
    main(sys.argv[1:])
