"""One thread's Python stack, sampled at a fixed interval from a thread of its own: where that thread's time goes,
by function, without the other threads' work.

cProfile runs on sys.monitoring from Python 3.12, which is process-wide: a profile of the engine's start-up then
also holds the adapter read-ahead's reads (docs/benchmarks.md), and nothing in it tells the two apart. A sample of
one thread's frames sees only that thread. It counts, per function, the samples with the function on the stack
(cumulative) and at its top (own: its Python, or a C call it made, a wait on the GPU included). A function's time is
its share of the samples times the time sampled: the sampler waits for the GIL like any thread, so its samples come
less often than asked when others hold it. The sampled thread runs at full speed between samples.
"""

from __future__ import annotations

import collections
import pathlib
import sys
import threading
from types import CodeType, FrameType

__all__ = ["INTERVAL_S", "StackSampler"]

INTERVAL_S = 0.002  # fine enough for a phase of seconds, coarse enough that walking the stack costs ~1% of a core

Function = tuple[str, int, str]  # file, first line, name: pstats' key, so the names read alike


def _function(code: CodeType) -> Function:
    return code.co_filename, code.co_firstlineno, code.co_name


class StackSampler:
    """Samples the thread `thread_id` every `interval` seconds between start() and stop()."""

    def __init__(self, thread_id: int, interval: float = INTERVAL_S) -> None:
        self.thread_id, self.interval = thread_id, interval
        self.samples = 0
        self.own: collections.Counter[Function] = collections.Counter()
        self.cumulative: collections.Counter[Function] = collections.Counter()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moelora-stack-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            if frame is not None:
                self.take(frame)

    def take(self, frame: FrameType | None) -> None:
        """Count one sample of the stack whose top is `frame`; a function recursing counts once."""
        if frame is None:
            return
        self.samples += 1
        self.own[_function(frame.f_code)] += 1
        seen: set[Function] = set()
        while frame is not None:
            function = _function(frame.f_code)
            if function not in seen:
                seen.add(function)
                self.cumulative[function] += 1
            frame = frame.f_back

    def share(self, n: int) -> float:
        return n / self.samples if self.samples else 0.0

    def report(self, rows: int, seconds: float) -> str:
        """The `rows` commonest functions on the stack, then at its top, with their samples, share and share of
        `seconds` (the time sampled)."""
        lines = [f"{self.samples:,} samples over {seconds:.2f} s, one asked every {self.interval * 1e3:g} ms"]
        for title, counter in (("on the stack (cumulative)", self.cumulative), ("at the top (own)", self.own)):
            lines += ["", f"by samples {title}:", "  samples  share        s  function"]
            for function, n in counter.most_common(rows):
                lines.append(f"{n:9,} {self.share(n):6.1%} {self.share(n) * seconds:8.2f}  {name(function)}")
        return "\n".join(lines) + "\n"


def name(function: Function) -> str:
    """A function as file:line(name), the file's name only."""
    filename, line, func = function
    return f"{pathlib.Path(filename).name}:{line}({func})"
