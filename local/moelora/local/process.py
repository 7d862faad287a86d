"""Local processes: free ports, start in their own process group, wait for an HTTP endpoint (or any probe), stop.

Every server of the local stack that is not in-process (vLLM, the agent, s3rver) is a child process started here
in a new session, so stopping it stops its whole tree (vLLM forks an engine core and workers), found by session id
in /proc even once re-parented.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("moelora.local.process")


PORT_FLOOR = 10000  # handed-out ports lie in [PORT_FLOOR, the ephemeral range's start)
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
_random = random.Random()  # seeded from the OS: two pytest workers walk different sequences


def cache_dir() -> pathlib.Path:
    """This machine's cache folder for moelora: $XDG_CACHE_HOME/moelora, else ~/.cache/moelora (XDG: unset or empty
    means the default)."""
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "moelora"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has not handed out before: the
    OS may offer a just-closed port again before the server it went to has bound it. It lies below the ephemeral
    range where there is room, because every outbound connection takes its local port from that range, and one that
    takes a handed-out port before its server binds makes that bind fail (EADDRINUSE)."""
    low = ephemeral_range()[0]
    with _handed_out_lock:
        while True:
            candidate = _random.randrange(PORT_FLOOR, low) if low - PORT_FLOOR >= 1000 else 0
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", candidate))
                except OSError:
                    continue  # bound by someone else: another candidate
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def ephemeral_range() -> tuple[int, int]:
    """The local ports Linux gives outbound connections (and bind to port 0); elsewhere its default."""
    try:
        low, high = (int(v) for v in pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


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


def session(sid: int) -> list[int]:
    """The pids of the processes of session `sid` that have not exited (zombies excluded), read from /proc.

    A container started by `spawn` leads its own session, and what it forks stays in it, also once re-parented to
    init (vLLM's engine core, workers and multiprocessing's resource tracker) or moved to another process group.
    """
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                line = stat.read()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and ")", so split after the last ")".
        fields = line[line.rindex(b")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


_gone: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()  # leaders whose whole session has exited


def _signal_session(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
    for pid in session(process.pid):  # members that left the leader's process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(processes: Sequence[subprocess.Popen[bytes]], *, timeout: float) -> bool:
    """Reap the leaders and wait until no member of their sessions is left; False if some are after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        leaders = [p.poll() for p in processes]
        if all(code is not None for code in leaders) and not any(session(p.pid) for p in processes):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_all(processes: Sequence[subprocess.Popen[bytes]], *, timeout: float = 20.0) -> list[int | None]:
    """Stop every process of the sessions `processes` lead (see `spawn`), together: SIGTERM to all of them, SIGKILL
    to what is left after `timeout` s, then wait until none is left. Returns the leaders' exit codes (None if one
    never exited). `timeout=0` kills at once, as the kernel does to a PID namespace whose init has exited
    (pid_namespaces(7)): a container's other processes do not outlive its main one."""
    # A session seen empty is not signalled again: its id may since have been given to an unrelated process.
    running = [p for p in processes if p not in _gone]
    if timeout > 0:
        for proc in running:
            _signal_session(proc, signal.SIGTERM)
    if timeout <= 0 or not _wait_gone(running, timeout=timeout):
        for proc in running:
            _signal_session(proc, signal.SIGKILL)
        if not _wait_gone(running, timeout=5):
            left = {p.pid: session(p.pid) for p in running}
            log.error("processes left after SIGKILL (session -> pids): %s", left)
    _gone.update(p for p in running if p.returncode is not None and not session(p.pid))
    return [p.poll() for p in processes]


def stop(process: subprocess.Popen[bytes], *, timeout: float = 20.0) -> int | None:
    """`stop_all` of one process: its whole session, SIGTERM then SIGKILL after `timeout` s; its exit code."""
    return stop_all([process], timeout=timeout)[0]


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
