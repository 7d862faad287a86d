"""A keyed work queue: every event about a ModelServer becomes its key here, and one pass per key runs at a time.

The contract is client-go's workqueue as controller-runtime drives it:
- a key added while it waits is not added twice (one pass serves every event before it starts);
- a key added while its pass runs is not run beside it, but runs once more after it, so no event is lost;
- `add(key, after=s)` waits s seconds first, and the earliest of two waits wins;
- a pass returns the seconds after which it wants its key again (RequeueAfter), or None;
- a pass that raises runs again after a backoff that doubles with each failure in a row and resets on success.
Passes of different keys run side by side, up to `concurrency` at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

# Retries of a failing key: 0.5 s, 1 s, 2 s, ... up to 5 minutes (kopf's own handler retries wait 60 s each).
BACKOFF_BASE = 0.5
BACKOFF_MAX = 300.0


class KeyedQueue(Generic[K]):
    """Keys waiting (`dirty`), keys being processed, timers of delayed keys. Lives in one event loop; `add` may be
    called before `start` (the keys wait for it)."""

    def __init__(
        self, *, concurrency: int = 16, backoff_base: float = BACKOFF_BASE, backoff_max: float = BACKOFF_MAX
    ) -> None:
        self._concurrency = concurrency
        self._backoff_base, self._backoff_max = backoff_base, backoff_max
        self._ready: asyncio.Queue[K] = asyncio.Queue()  # dirty and not processing, in arrival order
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: collections.Counter[K] = collections.Counter()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._process: Callable[[K], Awaitable[float | None]] | None = None
        self.passes = 0  # passes finished, failed ones included (tests and metrics read it)

    def add(self, key: K, *, after: float = 0.0) -> None:
        """Mark `key` as needing a pass, now or `after` seconds from now."""
        if after > 0:
            self._add_after(key, after)
            return
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # Done puts it back
        self._ready.put_nowait(key)

    def start(self, process: Callable[[K], Awaitable[float | None]]) -> None:
        """Run `process(key)` for the keys added, from now on (in the running loop)."""
        self._process = process
        self._workers = [asyncio.create_task(self._work(), name=f"moelora-queue-{n}") for n in range(self._concurrency)]

    async def stop(self) -> None:
        """Stop the workers (passes in flight are cancelled) and drop the timers; keys still waiting are dropped."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()

    def pending(self) -> int:
        """Keys waiting or being processed (not those waiting for a timer)."""
        return len(self._dirty | self._processing)

    async def drained(self, *, timeout: float = 10.0) -> None:
        """Until no key waits and none is being processed (tests)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pending():
            if loop.time() > deadline:
                raise TimeoutError(f"{self.pending()} key(s) still queued")
            await asyncio.sleep(0.005)

    def _add_after(self, key: K, delay: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None and timer.when() <= when:
            return  # an earlier wait is already set
        if timer is not None:
            timer.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_at(when, fire)

    async def _get(self) -> K:
        key = await self._ready.get()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    def _done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._ready.put_nowait(key)

    async def _work(self) -> None:
        assert self._process is not None
        while True:
            key = await self._get()
            try:
                again = await self._process(key)
            except asyncio.CancelledError:
                self._done(key)
                raise
            except Exception:  # noqa: BLE001 - one key's failure is retried, the others go on
                self._failures[key] += 1
                delay = min(self._backoff_max, self._backoff_base * 2 ** (self._failures[key] - 1))
                logger.exception("pass of %s failed (%d in a row); again in %.1f s", key, self._failures[key], delay)
                again = delay
            else:
                self._failures.pop(key, None)
            finally:
                self.passes += 1
            self._done(key)
            if again is not None:
                self.add(key, after=max(again, 1e-3))
