"""Where an engine's start-up goes, as a diagnostic: with `MOELORA_PROFILE_STARTUP=DIR`, cProfile runs from the
creation of vLLM's LoRA manager (right after the weights load) to the end of CUDA-graph capture, or of vLLM's kernel
warm-up where nothing is captured (`--enforce-eager`): torch.compile's cache, the profile run, the KV cache, the
plugin's and vLLM's warm-ups and the capture. It writes DIR/<phase>-<pid>.txt (functions by cumulative and by own
time) and logs the three costliest by own time. Up to Python 3.11 it sees the engine's thread only; from 3.12
(cProfile on sys.monitoring) every thread, the plugin's adapter read-ahead included. With
`MOELORA_PROFILE_STARTUP_BY=samples` the engine's thread alone is sampled instead (stack_sampler.py): the same
listings by samples, at full speed between them, and no raw profile.
With `MOELORA_PROFILE_STARTUP_FROM=graph-capture` the profile starts at vLLM's first CUDA-graph capture phase instead,
so a cold start's compile stays outside it. Beside the text goes the raw profile (<phase>-<pid>.prof, pstats' format),
for questions the two listings do not answer (callers of a function, say).

A second pod's engine init is where a LoRA server loses most against one without LoRA; this tells host Python (the
plugin's and vLLM's per-call work, multiplied by every captured size) from waits on the GPU (time inside
synchronize, `item` or a copy to the host), and which phase holds them. cProfile slows Python-heavy code, so the
figures are shares, not timings. Unset (the default), nothing is profiled. host_adapters places the two calls.

With `MOELORA_STARTUP_GC=1`, the same window logs each garbage collection that takes SLOW_MS or more (vLLM collects
in full around its profile run and each capture phase) with the size of the heap it traversed, and after the first
slow full ones the heap's commonest types, so a costly collection can be traced to what fills the heap. No cProfile
is needed for it, so it can watch a cold start without cProfile's slowdown.
"""

from __future__ import annotations

import collections
import cProfile
import gc
import io
import logging
import os
import pathlib
import pstats
import threading
import time

from .stack_sampler import StackSampler, name

__all__ = ["BY_ENV", "FROM_ENV", "GC_ENV", "PHASES", "PROFILE_ENV", "start", "stop"]

log = logging.getLogger("vllm.moelora_plugin")

PROFILE_ENV = "MOELORA_PROFILE_STARTUP"
FROM_ENV = "MOELORA_PROFILE_STARTUP_FROM"
BY_ENV = "MOELORA_PROFILE_STARTUP_BY"
PROFILERS = ("cprofile", "samples")
PHASES = ("engine-init", "graph-capture")  # where a profile may start, in the order a start-up reaches them
ROWS = 60  # functions listed per ordering: enough to reach past vLLM's wrappers to the calls they make
GC_ENV = "MOELORA_STARTUP_GC"
SLOW_MS = 20.0  # a collection logged: well above a young generation's, near what a full one over a large heap costs
CENSUSES, TOP_TYPES = 3, 8  # each census walks the heap once: a few suffice


_running: list[tuple[cProfile.Profile | StackSampler, str, float, pathlib.Path]] = []  # at most one, on one thread


class _GcWatch:
    """A gc callback: times each collection, logs the slow ones with the tracked heap's size (for full ones) and,
    after the first CENSUSES slow full ones, the heap's commonest types."""

    def __init__(self) -> None:
        self.t0 = self.total_ms = self.full_ms = 0.0
        self.collections = self.full = self.censuses = self.heap = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        generation = info.get("generation", 0)
        if phase == "start":
            self.heap = len(gc.get_objects()) if generation == 2 else 0
            self.t0 = time.perf_counter()
            return
        ms = (time.perf_counter() - self.t0) * 1e3
        self.collections += 1
        self.total_ms += ms
        if generation == 2:
            self.full += 1
            self.full_ms += ms
        if ms < SLOW_MS:
            return
        census = ""
        if generation == 2 and self.censuses < CENSUSES:
            self.censuses += 1
            counts = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
            census = "; commonest: " + ", ".join(f"{name} {n:,}" for name, n in counts.most_common(TOP_TYPES))
        log.info(
            "moelora: gc (generation %d) took %.0f ms over %s tracked objects, %s collected%s",
            generation,
            ms,
            f"{self.heap:,}" if generation == 2 else "the young",
            info.get("collected", "?"),
            census,
        )

    def summary(self) -> str:
        return (
            f"{self.collections} collections in {self.total_ms:.0f} ms, {self.full} full ones in {self.full_ms:.0f} ms"
        )


_gc_watch: list[_GcWatch] = []  # at most one, from start to stop


def _choice(env: str, choices: tuple[str, ...], preposition: str) -> str:
    """The value of `env` among `choices`; unset or unknown (warned of), the first."""
    raw = os.environ.get(env, "").strip()
    if raw and raw not in choices:
        log.warning("moelora: %s=%r is none of %s; profiling %s %s", env, raw, choices, preposition, choices[0])
    return raw if raw in choices else choices[0]


def start(phase: str) -> None:
    """Start profiling this thread as `phase` when PROFILE_ENV names a folder, no profile runs yet and `phase` is the
    one FROM_ENV picks (a phase outside PHASES always may); watch the garbage collector when GC_ENV is 1."""
    if os.environ.get(GC_ENV) == "1" and not _gc_watch:
        _gc_watch.append(_GcWatch())
        gc.callbacks.append(_gc_watch[0])
    root = os.environ.get(PROFILE_ENV, "")
    if not root or _running or (phase in PHASES and phase != _choice(FROM_ENV, PHASES, "from")):
        return
    if _choice(BY_ENV, PROFILERS, "by") == "samples":
        sampler = StackSampler(threading.get_ident())
        sampler.start()
        _running.append((sampler, phase, time.monotonic(), pathlib.Path(root)))
        log.info("moelora: sampling %s's thread into %s", phase, root)
        return
    profile = cProfile.Profile()
    try:
        profile.enable()
    except ValueError as exc:  # another profiler holds the interpreter's profiling hook
        log.warning("moelora: %s not profiled: %s", phase, exc)
        return
    _running.append((profile, phase, time.monotonic(), pathlib.Path(root)))
    log.info("moelora: profiling %s into %s", phase, root)


def stop() -> None:
    """Stop the running profile, if any, and write it; on the thread that started it. Stop watching the collector."""
    if _gc_watch:
        watch = _gc_watch.pop()
        gc.callbacks.remove(watch)
        log.info("moelora: garbage collection during the start-up: %s", watch.summary())
    if not _running:
        return
    profile, phase, t0, root = _running.pop()
    if isinstance(profile, StackSampler):
        profile.stop()
    else:
        profile.disable()
    _write(profile, phase, time.monotonic() - t0, root)


def _write(profile: cProfile.Profile | StackSampler, phase: str, seconds: float, root: pathlib.Path) -> None:
    """The profile's two orderings (cumulative, own) to a file, cProfile's raw profile beside it, the top three by own
    time to the log; never raises."""
    try:
        if isinstance(profile, StackSampler):
            text = f"{phase}: {seconds:.2f} s, the engine's thread sampled\n\n" + profile.report(ROWS, seconds)
            how = ", sampled"
            costliest = ", ".join(
                f"{name(function)} {profile.share(n) * seconds:.2f} s" for function, n in profile.own.most_common(3)
            )
        else:
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out)
            out.write(f"{phase}: {seconds:.2f} s (under cProfile)\n\n")
            stats.sort_stats("cumulative").print_stats(ROWS)
            stats.sort_stats("tottime").print_stats(ROWS)
            text, how = out.getvalue(), " under cProfile"
            top = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:3]  # type: ignore[attr-defined]
            costliest = ", ".join(f"{_name(func)} {row[2]:.2f} s in {row[1]} calls" for func, row in top)
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{phase}-{os.getpid()}.txt"
        path.write_text(text)
        if isinstance(profile, cProfile.Profile):
            profile.dump_stats(path.with_suffix(".prof"))
        log.info("moelora: %s took %.2f s%s (%s); costliest: %s", phase, seconds, how, path, costliest)
    except Exception as exc:  # noqa: BLE001  (a diagnostic must not stop a start-up)
        log.warning("moelora: profile of %s not written: %r", phase, exc)


def _name(func: tuple[str, int, str]) -> str:
    return func[2] if func[0] == "~" else name(func)
