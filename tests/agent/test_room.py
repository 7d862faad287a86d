"""Room in the adapter cache as the loop sees it (a fake vLLM, real S3, a clock the test moves): what a delete
frees, and when an adapter refused for room tries again."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
from collections.abc import Iterator

import pytest

from moelora.agent.reconcile import Record, Stage
from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.api import FailureReason

from .conftest import FakeVllm, MemoryDesired, MemoryKube, adapter_files, agent_settings, upload


@dataclasses.dataclass
class Loop:
    """An agent whose cache has room for one of the adapters "a" and "c", not both; "a" is served."""

    agent: Agent
    desired: MemoryDesired
    vllm: FakeVllm
    bucket: str
    clock: list[float]  # the agent's monotonic clock

    @property
    def now(self) -> float:
        return self.clock[0]

    @now.setter
    def now(self, value: float) -> None:
        self.clock[0] = value

    def settle(self) -> None:
        """One pass, then wait for the downloads it started; the next pass takes them in and has vLLM load them."""
        self.agent.step()
        concurrent.futures.wait(list(self.agent.busy.values()), timeout=30)
        self.agent.step()

    def put(self, name: str) -> None:
        self.desired.put(name, {"source": {"uri": f"s3://{self.bucket}/{name}/"}})

    def record(self, name: str) -> Record:
        return self.agent.records[f"uid-{name}"]


@pytest.fixture
def loop(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> Iterator[Loop]:
    size = sum(len(b) for b in adapter_files().values())
    for name, seed in (("a", 1), ("c", 2)):
        upload(s3_env, bucket, f"{name}/", adapter_files(seed=seed))
    settings = agent_settings(tmp_path / "cache", cache_bytes=int(1.5 * size), poll_seconds=1.0)
    desired, vllm, clock = MemoryDesired(), FakeVllm(), [1000.0]
    agent = Agent(
        settings=settings,
        kube=MemoryKube(),
        desired=desired,
        vllm=vllm,  # type: ignore[arg-type]
        metrics=Metrics(),
        monotonic=lambda: clock[0],
    )
    state = Loop(agent=agent, desired=desired, vllm=vllm, bucket=bucket, clock=clock)
    desired.synced.set()
    state.put("a")
    state.settle()
    assert set(vllm.served) == {"a"}
    yield state
    agent.stop()


def test_a_deleted_adapters_files_make_room_in_the_same_pass(loop: Loop) -> None:
    a_version = loop.record("a").version
    loop.desired.delete("a")
    loop.put("c")
    loop.settle()

    c = loop.record("c")
    assert (c.stage, c.reason, c.attempts) == (Stage.LOADED, None, 0)  # no CacheFull turn on the way
    assert set(loop.vllm.served) == {"c"}
    cache = loop.agent.settings.cache_dir
    assert {p.name for p in cache.iterdir() if not p.name.startswith(".")} == {c.version} != {a_version}


def test_an_adapter_refused_for_room_retries_within_a_poll_once_a_delete_makes_room(loop: Loop) -> None:
    loop.put("c")
    loop.settle()
    for _ in range(5):  # "a" is served, so "c" is refused again and again: its backoff grows to half a minute
        loop.now = loop.record("c").retry_at
        loop.settle()
        assert (loop.record("c").stage, loop.record("c").reason) == (Stage.FAILED, FailureReason.CACHE_FULL)
    retry_at = loop.record("c").retry_at
    assert retry_at - loop.now >= 16.0

    loop.desired.delete("a")
    loop.agent.step()  # unloads "a": its files may go
    loop.now += loop.agent.settings.poll_seconds
    loop.settle()
    assert loop.now < retry_at  # well before its backoff ends ...
    assert loop.record("c").stage is Stage.LOADED and set(loop.vllm.served) == {"c"}  # ... it is served


def test_a_refused_adapter_keeps_to_its_backoff_while_nothing_makes_room(loop: Loop) -> None:
    loop.put("c")
    loop.settle()
    early = 0
    for _ in range(30):  # passes 0.2 s apart: many before each retry is due, a few after
        due, attempts = loop.record("c").retry_at, loop.record("c").attempts
        loop.now += 0.2
        loop.settle()
        if loop.now < due:
            early += 1
            assert loop.record("c").attempts == attempts  # not retried before its time
    assert early >= 10 and loop.record("c").reason is FailureReason.CACHE_FULL
