"""The keyed queue's contract (client-go's workqueue as controller-runtime drives it), in virtual loop time: a key
runs one pass at a time, events before a pass starts cost one pass, events during it cost one more after it,
delays and RequeueAfter wake it later (the earliest wins), failures back off exponentially."""

from __future__ import annotations

import asyncio

import pytest

from moelora.operator.control.workqueue import KeyedQueue

pytestmark = pytest.mark.looptime


class Recorder:
    """A pass that records (key, loop time), takes `seconds`, and returns `again[key]` (popped) or raises."""

    def __init__(self, *, seconds: float = 1.0) -> None:
        self.seconds = seconds
        self.runs: list[tuple[str, float]] = []
        self.running: set[str] = set()
        self.overlaps = 0
        self.again: dict[str, list[float | None]] = {}
        self.fail: dict[str, int] = {}

    async def __call__(self, key: str) -> float | None:
        if key in self.running:
            self.overlaps += 1
        self.running.add(key)
        self.runs.append((key, asyncio.get_running_loop().time()))
        try:
            await asyncio.sleep(self.seconds)
            if self.fail.get(key, 0) > 0:
                self.fail[key] -= 1
                raise RuntimeError("the API server said no")
            queued = self.again.get(key) or [None]
            return queued.pop(0)
        finally:
            self.running.discard(key)


async def test_keys_added_before_a_pass_starts_cost_one_pass() -> None:
    queue, work = KeyedQueue[str](), Recorder()
    for _ in range(100):
        queue.add("ns/a")
    queue.start(work)
    await queue.drained()
    await queue.stop()
    assert [key for key, _ in work.runs] == ["ns/a"]


async def test_a_key_added_during_its_pass_runs_once_more_after_never_beside_it() -> None:
    queue, work = KeyedQueue[str](), Recorder(seconds=1.0)
    queue.start(work)
    queue.add("ns/a")
    await asyncio.sleep(0.5)  # the first pass is running
    for _ in range(100):
        queue.add("ns/a")
    await queue.drained()
    await queue.stop()
    assert [at for _, at in work.runs] == [pytest.approx(0.0, abs=0.01), pytest.approx(1.0, abs=0.01)]
    assert work.overlaps == 0


async def test_passes_of_different_keys_run_side_by_side_up_to_the_concurrency() -> None:
    queue, work = KeyedQueue[str](concurrency=2), Recorder(seconds=1.0)
    queue.start(work)
    for key in ("a", "b", "c"):
        queue.add(key)
    await queue.drained()
    await queue.stop()
    assert [(key, round(at, 2)) for key, at in work.runs] == [("a", 0.0), ("b", 0.0), ("c", 1.0)]


async def test_a_delayed_key_waits_and_the_earliest_wait_wins() -> None:
    queue, work = KeyedQueue[str](), Recorder(seconds=0.0)
    queue.start(work)
    queue.add("a", after=10)
    queue.add("a", after=3)  # earlier: replaces the 10 s wait
    queue.add("a", after=20)  # later than the one set: ignored
    await asyncio.sleep(30)
    await queue.stop()
    assert [round(at, 2) for _, at in work.runs] == [3.0]


async def test_requeue_after_runs_the_key_again_then() -> None:
    queue, work = KeyedQueue[str](), Recorder(seconds=0.0)
    work.again["a"] = [5.0, None]  # a drain time ends 5 s after the first pass
    queue.start(work)
    queue.add("a")
    await asyncio.sleep(10)
    await queue.stop()
    assert [round(at, 2) for _, at in work.runs] == [0.0, 5.0]


async def test_a_failing_pass_backs_off_exponentially_and_resets_on_success() -> None:
    queue, work = KeyedQueue[str](backoff_base=1.0, backoff_max=4.0), Recorder(seconds=0.0)
    work.fail["a"] = 4
    queue.start(work)
    queue.add("a")
    await asyncio.sleep(20)
    assert [round(at, 2) for _, at in work.runs] == [0.0, 1.0, 3.0, 7.0, 11.0]  # waits 1, 2, 4, then capped at 4
    work.fail["a"] = 1
    queue.add("a")
    await asyncio.sleep(5)
    await queue.stop()
    assert [round(at, 2) for _, at in work.runs][5:] == [20.0, 21.0]  # the count started again from 1 s
