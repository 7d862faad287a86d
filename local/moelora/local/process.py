"""Local processes: free ports, start in their own process group, wait for an HTTP endpoint (or any probe), stop.

Every server of the local stack that is not in-process (vLLM, the agent, s3rver) is a child process started here
in a new session, so stopping it stops its whole tree (vLLM forks an engine core and workers).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(
    *, argv: Sequence[str], env: Mapping[str, str], log_path: pathlib.Path, cwd: pathlib.Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` with exactly `env`, stdout+stderr appended to `log_path`, as the leader of a new session."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes], *, timeout: float = 20.0) -> int | None:
    """SIGTERM the process's group, SIGKILL it after `timeout` s; return the exit code (None if it never exited)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # Children may outlive the leader (vLLM's engine core); the group id is still the leader's pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    return process.poll()


def http_ok(url: str, *, timeout: float = 2.0) -> bool:
    """True if GET `url` answers 2xx; False on any other status or a connection error."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_http_ok(
    url: str,
    *,
    timeout: float,
    process: subprocess.Popen[bytes] | None = None,
    log_path: pathlib.Path | None = None,
    interval: float = 0.2,
) -> None:
    """Poll `url` until it answers 2xx. Raise RuntimeError (with the log's tail) if `process` dies or time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http_ok(url):
            return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} was up{_tail(log_path)}")
        time.sleep(interval)
    raise RuntimeError(f"{url} not up after {timeout:.0f} s{_tail(log_path)}")


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str = "condition", interval: float = 0.05) -> T:
    """Poll `probe` until it returns something truthy, and return that; AssertionError once `timeout` has passed.

    The probe always runs once more after the deadline, so a slow last step is not reported as a time-out.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _tail(log_path: pathlib.Path | None, lines: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    text = log_path.read_text(errors="replace").splitlines()[-lines:]
    return "; log tail:\n" + "\n".join(text)
