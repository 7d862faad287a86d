"""Room in the adapter cache as the loop sees it (a fake vLLM, real S3): what a delete frees, and when."""

from __future__ import annotations

import concurrent.futures
import pathlib

from moelora.agent.metrics import Metrics
from moelora.agent.reconcile import Stage
from moelora.agent.runner import Agent
from moelora.api import FailureReason

from .conftest import FakeVllm, MemoryDesired, MemoryKube, adapter_files, agent_settings, upload


def _settle(agent: Agent) -> None:
    """One pass, then wait for the downloads it started; the next pass takes them in and has vLLM load them."""
    agent.step()
    concurrent.futures.wait(list(agent.busy.values()), timeout=30)
    agent.step()


def test_a_deleted_adapters_files_make_room_in_the_same_pass(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    # Room for one adapter, not two: "c" fits only by evicting "a", which vLLM served until this very pass.
    size = sum(len(b) for b in adapter_files().values())
    for name, seed in (("a", 1), ("c", 2)):
        upload(s3_env, bucket, f"{name}/", adapter_files(seed=seed))
    settings = agent_settings(tmp_path / "cache", cache_bytes=int(1.5 * size))
    kube, desired, vllm = MemoryKube(), MemoryDesired(), FakeVllm()
    agent = Agent(settings=settings, kube=kube, desired=desired, vllm=vllm, metrics=Metrics())  # type: ignore[arg-type]
    try:
        desired.synced.set()
        desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
        _settle(agent)
        assert set(vllm.served) == {"a"}
        a_version = agent.records["uid-a"].version

        desired.delete("a")
        desired.put("c", {"source": {"uri": f"s3://{bucket}/c/"}})
        _settle(agent)

        c = agent.records["uid-c"]
        assert (c.stage, c.reason, c.attempts) == (Stage.LOADED, None, 0)  # no CacheFull turn on the way
        assert set(vllm.served) == {"c"}
        entries = {p.name for p in settings.cache_dir.iterdir() if not p.name.startswith(".")}
        assert entries == {c.version} and a_version not in entries
    finally:
        agent.stop()


def test_an_adapter_refused_for_room_retries_within_a_poll_once_a_delete_makes_room(
    s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    size = sum(len(b) for b in adapter_files().values())
    for name, seed in (("a", 1), ("c", 2)):
        upload(s3_env, bucket, f"{name}/", adapter_files(seed=seed))
    settings = agent_settings(tmp_path / "cache", cache_bytes=int(1.5 * size), poll_seconds=1.0)
    kube, desired, vllm, clock = MemoryKube(), MemoryDesired(), FakeVllm(), [1000.0]
    agent = Agent(
        settings=settings,
        kube=kube,
        desired=desired,
        vllm=vllm,  # type: ignore[arg-type]
        metrics=Metrics(),
        monotonic=lambda: clock[0],
    )
    try:
        desired.synced.set()
        desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
        _settle(agent)
        desired.put("c", {"source": {"uri": f"s3://{bucket}/c/"}})
        c = None
        for _ in range(6):  # "a" is served, so "c" is refused again and again: its backoff grows to half a minute
            if c is not None:
                clock[0] = c.retry_at
            _settle(agent)
            c = agent.records["uid-c"]
            assert (c.stage, c.reason) == (Stage.FAILED, FailureReason.CACHE_FULL)
        assert c is not None and c.retry_at - clock[0] >= 16.0

        desired.delete("a")
        agent.step()  # unloads "a": its files may go
        clock[0] += settings.poll_seconds
        _settle(agent)
        assert clock[0] < c.retry_at  # well before its backoff ends ...
        assert agent.records["uid-c"].stage is Stage.LOADED and set(vllm.served) == {"c"}  # ... it is served
    finally:
        agent.stop()


def test_a_refused_adapter_keeps_to_its_backoff_while_nothing_makes_room(
    s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    size = sum(len(b) for b in adapter_files().values())
    for name, seed in (("a", 1), ("c", 2)):
        upload(s3_env, bucket, f"{name}/", adapter_files(seed=seed))
    settings = agent_settings(tmp_path / "cache", cache_bytes=int(1.5 * size), poll_seconds=0.1)
    kube, desired, vllm, clock = MemoryKube(), MemoryDesired(), FakeVllm(), [1000.0]
    agent = Agent(
        settings=settings,
        kube=kube,
        desired=desired,
        vllm=vllm,  # type: ignore[arg-type]
        metrics=Metrics(),
        monotonic=lambda: clock[0],
    )
    try:
        desired.synced.set()
        desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
        _settle(agent)
        desired.put("c", {"source": {"uri": f"s3://{bucket}/c/"}})
        _settle(agent)
        early = 0
        for _ in range(30):  # passes every 0.2 s: many before each retry is due, a few after
            c = agent.records["uid-c"]
            due, attempts = c.retry_at, c.attempts
            clock[0] += 0.2
            _settle(agent)
            if clock[0] < due:
                early += 1
                assert agent.records["uid-c"].attempts == attempts  # not retried before its time
        assert early >= 10 and agent.records["uid-c"].reason is FailureReason.CACHE_FULL
    finally:
        agent.stop()
