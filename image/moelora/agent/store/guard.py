"""Keeping one adapter's S3 trouble its own: deadlines, a transfer-rate floor, cancellation, and a cap per endpoint.

A `Watch` belongs to one preparation: its checks raise `Cancelled` (the adapter was deleted or changed), or a
TransientError once the overall deadline passed or the transfer ran below the rate floor for a whole window. The S3
connections its threads take (sockets.py) are attached to it, and cancelling it shuts their sockets down, so a call
blocked in a read (a body that drips a byte at a time, under the read timeout) ends at once.
`EndpointGates` lets at most K preparations use one S3 endpoint at a time; a preparation that finds its endpoint
full is `Deferred` (no worker thread waits for a slot), so a hanging endpoint holds at most K workers.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from moelora.agent.errors import TransientError
from moelora.api import FailureReason

T = TypeVar("T")


class Cancelled(Exception):
    """The adapter was deleted or its spec changed mid-way: stop, and keep none of its bytes."""


class Deferred(Exception):
    """Its S3 endpoint already has its share of workers: try again when one finishes (no failure, no attempt).

    `stuck`: every one of those slots is held by a call its preparation gave up on (the endpoint hangs)."""

    def __init__(self, *, stuck: bool = False) -> None:
        super().__init__("stuck" if stuck else "busy")
        self.stuck = stuck


class Watch:
    """Deadline, rate floor and cancellation of one preparation; thread-safe."""

    def __init__(
        self,
        *,
        min_rate: float,
        window: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_rate = min_rate
        self.window = window
        self.clock = clock
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._deadline = float("inf")
        self._what = ""
        self._window_start = clock()
        self._window_bytes = 0
        self._connections: set[Any] = set()  # urllib3 connections its threads hold now

    def cancel(self) -> None:
        """Stop the preparation and every call it made, also those it gave up on but that still run."""
        self.cancelled.set()
        self.sever()

    def attach(self, connection: Any) -> None:
        """A connection one of its threads took from the pool; Cancelled once the preparation is."""
        with self._lock:
            if self.cancelled.is_set():
                raise Cancelled()
            self._connections.add(connection)

    def detach(self, connection: Any) -> None:
        with self._lock:
            self._connections.discard(connection)

    def sever(self) -> int:
        """Shut down the sockets of the connections its threads hold: a read blocked on one returns at once (a
        close from another thread would not wake it). Returns how many."""
        with self._lock:
            held = [getattr(c, "sock", None) for c in self._connections]
        count = 0
        for sock in held:
            if sock is not None:
                with contextlib.suppress(OSError):  # closed meanwhile
                    sock.shutdown(socket.SHUT_RDWR)
                    count += 1
        return count

    def start(self, what: str, *, seconds: float) -> None:
        """A new phase (listing, download) with its own deadline; the rate window starts afresh."""
        with self._lock:
            self._what = what
            self._deadline = self.clock() + seconds
            self._window_start = self.clock()
            self._window_bytes = 0

    def add(self, count: int) -> None:
        with self._lock:
            self._window_bytes += count

    def check(self, *, rate: bool = True) -> None:
        """Raise Cancelled, or TransientError(EndpointUnreachable) past the deadline or below the rate floor."""
        if self.cancelled.is_set():
            raise Cancelled()
        with self._lock:
            now = self.clock()
            if now > self._deadline:
                raise TransientError(f"{self._what}: deadline passed", reason=FailureReason.ENDPOINT_UNREACHABLE)
            elapsed = now - self._window_start
            if rate and elapsed >= self.window:
                speed = self._window_bytes / elapsed
                if speed < self.min_rate:
                    raise TransientError(
                        f"{self._what}: {speed:.0f} bytes/s over {elapsed:.0f} s, below the floor of "
                        f"{self.min_rate:.0f} bytes/s",
                        reason=FailureReason.ENDPOINT_UNREACHABLE,
                    )
                self._window_start, self._window_bytes = now, 0


_working = threading.local()


@contextlib.contextmanager
def working_for(watch: Watch) -> Iterator[None]:
    """The S3 connections this thread takes meanwhile are attached to `watch` (sockets.py)."""
    previous = getattr(_working, "watch", None)
    _working.watch = watch
    try:
        yield
    finally:
        _working.watch = previous


def current() -> Watch | None:
    """The watch of the preparation this thread works for, if any."""
    return getattr(_working, "watch", None)


def bounded(
    call: Callable[[], T], *, watch: Watch, poll: float = 0.05, on_exit: Callable[[], None] = lambda: None
) -> T:
    """`call()`'s result, given up on at the watch's deadline or cancellation (checked every `poll` seconds).

    A blocking boto3 call cannot be interrupted: it runs on a daemon thread, attached to the watch, that is left to
    end on its own socket timeout after a deadline, and at once after a cancellation (Watch.cancel shuts its socket
    down); `on_exit` runs when it ends (releasing what it holds, e.g. its endpoint slot)."""
    done = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        try:
            with working_for(watch):
                box["result"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            box["error"] = error
        finally:
            done.set()
            on_exit()

    threading.Thread(target=run, name="bounded", daemon=True).start()
    while not done.wait(poll):
        watch.check(rate=False)
    if "error" in box:
        error = box["error"]
        if isinstance(error, Exception) and watch.cancelled.is_set():
            raise Cancelled() from None  # the cancel shut its socket down: what failed after it is the cancel's doing
        raise error  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]


class EndpointGates:
    """At most `per_endpoint` preparations per S3 endpoint URL (None: the server's default endpoint)."""

    def __init__(self, *, per_endpoint: int) -> None:
        self.per_endpoint = per_endpoint
        self._lock = threading.Lock()
        self._holders: dict[str | None, int] = {}
        self._orphans: dict[str | None, int] = {}  # slots held only by calls given up on

    def try_slot(self, endpoint: str | None) -> Slot | None:
        with self._lock:
            if self._holders.get(endpoint, 0) >= self.per_endpoint:
                return None
            self._holders[endpoint] = self._holders.get(endpoint, 0) + 1
        return Slot(self, endpoint)

    def _leave(self, endpoint: str | None) -> None:
        with self._lock:
            self._holders[endpoint] = max(0, self._holders.get(endpoint, 0) - 1)

    def _orphan(self, endpoint: str | None, change: int) -> None:
        with self._lock:
            self._orphans[endpoint] = self._orphans.get(endpoint, 0) + change

    def stuck(self, endpoint: str | None) -> bool:
        """Every slot of the endpoint is held by a call whose preparation gave up on it (deadline, cancel)."""
        with self._lock:
            return self._orphans.get(endpoint, 0) >= self.per_endpoint

    def holders(self, endpoint: str | None) -> int:
        with self._lock:
            return self._holders.get(endpoint, 0)


class Slot:
    """One preparation's place at its endpoint, freed when the last of its users (the worker, a call given up on
    but still blocked in a socket) lets go."""

    def __init__(self, gates: EndpointGates, endpoint: str | None) -> None:
        self._gates = gates
        self._endpoint = endpoint
        self._users = 1
        self._orphaned = False  # the preparation is over, a call it gave up on still holds the slot
        self._on_free: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def when_free(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the last user lets go (at once if none holds it)."""
        with self._lock:
            if self._users > 0:
                self._on_free.append(callback)
                return
        callback()

    def hold(self) -> None:
        with self._lock:
            self._users += 1

    def leave(self) -> None:
        """The preparation's own drop: a call still running keeps the slot, as an orphan."""
        with self._lock:
            self._orphaned = self._users > 1
        if self._orphaned:
            self._gates._orphan(self._endpoint, 1)
        self.drop()

    def drop(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
            callbacks, self._on_free = (self._on_free, []) if last else ([], self._on_free)
        if last:
            if self._orphaned:
                self._gates._orphan(self._endpoint, -1)
            self._gates._leave(self._endpoint)
            for callback in callbacks:
                callback()
