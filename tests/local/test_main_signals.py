"""`python -m moelora.local` stops at any moment: SIGTERM or Ctrl-C during start-up ends it within 5 s, and no process
of vLLM's tree outlives a `kill -KILL` of vLLM's API server (the kubelet's restart) or the shutdown after it."""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from moelora.local import process

pytestmark = pytest.mark.slow
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "local"
EXIT_WITHIN = 5.0  # seconds from the signal to the exit


class Demo:
    """The demo as a child process, its output read line by line in a thread."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moelora.local", "--dir", str(root), "--manifests", str(EXAMPLES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, text: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {text!r} in {timeout:g} s:\n{self.output}") from None
            if line is None:
                raise AssertionError(f"exited with {self.proc.wait()} before {text!r}:\n{self.output}")
            self.output += line

    def signal_and_wait(self, signum: int) -> float:
        """Send `signum`; return the seconds until the demo exited."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        self.proc.wait(timeout=60)
        took = time.monotonic() - sent
        while (line := self.lines.get(timeout=10)) is not None:
            self.output += line
        return took


@pytest.fixture
def demo(tmp_path: pathlib.Path) -> Iterator[Callable[[], Demo]]:
    started: list[Demo] = []

    def start() -> Demo:
        started.append(Demo(tmp_path / "local"))
        return started[-1]

    yield start
    for run in started:  # a failed test must not leave vLLM behind: kill each session the demo's pods led
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        for pid in _mentioning(run.root):
            with contextlib.suppress(OSError):
                os.killpg(os.getsid(pid), signal.SIGKILL)


def _mentioning(root: pathlib.Path) -> list[int]:
    """Pids of the processes (but this one) with `root` in their command line."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in argv:
            found.append(int(proc.name))
    return found


def _vllm_api_servers(root: pathlib.Path) -> list[int]:
    """Pids of the vLLM API servers whose model lives under `root` (the pod's volume)."""
    found = []
    for pid in _mentioning(root):
        with contextlib.suppress(OSError):
            if b"vllm.entrypoints.openai.api_server" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


_until = functools.partial(process.wait_for, interval=0.2)  # poll until truthy, else AssertionError


def test_sigterm_while_the_model_is_generated(demo: Callable[[], Demo]) -> None:
    run = demo()
    run.wait_line("generating the tiny Qwen3-MoE", timeout=120)
    took = run.signal_and_wait(signal.SIGTERM)
    print(f"exited {took:.1f} s after SIGTERM")
    assert run.proc.returncode == 128 + signal.SIGTERM, run.output
    assert took < EXIT_WITHIN, run.output
    assert "SIGTERM during start-up" in run.output and "stopped; everything it started has exited" in run.output


def test_vllm_killed_restarted_then_ctrl_c_leaves_no_process(
    demo: Callable[[], Demo], running_in: Callable[[int], list[int]]
) -> None:
    run = demo()
    run.wait_line("waiting for the operator's Deployment", timeout=180)
    # vLLM's API server leads its container's session; wait for its engine core and resource tracker too.
    (first,) = _until(lambda: _vllm_api_servers(run.root), timeout=120, what="vLLM's API server")
    _until(lambda: len(running_in(first)) >= 3, timeout=180, what="vLLM's processes")
    os.kill(first, signal.SIGKILL)  # the API server only, as `kill -KILL <pid>` does
    (second,) = _until(
        lambda: [pid for pid in _vllm_api_servers(run.root) if pid != first], timeout=60, what="vLLM restarted"
    )
    assert running_in(first) == []  # the old container's processes died before it restarted
    _until(lambda: len(running_in(second)) >= 2, timeout=120, what="the restarted vLLM's engine core")
    took = run.signal_and_wait(signal.SIGINT)  # Ctrl-C, still during start-up: vLLM is not ready yet
    print(f"exited {took:.1f} s after SIGINT")
    assert run.proc.returncode == 128 + signal.SIGINT, run.output
    assert "pods:" in run.output and "Press Ctrl-C to stop" not in run.output
    assert took < EXIT_WITHIN, run.output
    assert running_in(first) == [] and running_in(second) == []
    assert "stopped; everything it started has exited" in run.output
