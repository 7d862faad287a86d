"""The agent's loop through faults, with vLLM faked in memory: refused updates keep the last good version (also
across agent restarts), readiness stops waiting, the status follows vLLM within a poll, deletes cancel downloads,
and a hanging endpoint delays nobody else."""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.agent.errors import TransientError
from moelora.agent.reconcile import LoadedAdapter
from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.local.faults import Drip, FaultProxy, Hang, Rule

from .conftest import (
    KEYS,
    MemoryDesired,
    MemoryKube,
    adapter_files,
    agent_settings,
    eventually,
    upload,
)


class FakeVllm:
    """What the loop asks of vLLM, in memory; `up = False` answers like a vLLM that is down."""

    def __init__(self) -> None:
        self.served: dict[str, str] = {}
        self.up = True

    def adapters(self, *, poll: float | None = None) -> dict[str, LoadedAdapter]:
        if not self.up:
            raise TransientError("vLLM is down")
        return {name: LoadedAdapter(name=name, path=path, parent="base") for name, path in self.served.items()}

    def load(self, *, name: str, path: str, inplace: bool = False) -> None:
        if not self.up:
            raise TransientError("vLLM is down")
        self.served[name] = path

    def canary(self, *, name: str) -> None:
        if not self.up:
            raise TransientError("vLLM is down")

    def unload(self, *, name: str) -> bool:
        return self.served.pop(name, None) is not None


class Loop:
    def __init__(self, cache: pathlib.Path, vllm: FakeVllm, kube: MemoryKube, desired: MemoryDesired, **changes: Any):
        small = {
            "poll_seconds": 0.2,
            "list_timeout_seconds": 1.0,
            "rate_window_seconds": 5.0,  # no test here is about the floor: a loaded machine's pause must not trip it
            "min_bytes_per_second": 4096,
            "s3_read_timeout_seconds": 2.0,
        }
        self.settings = agent_settings(cache, **(small | changes))
        self.metrics = Metrics()
        self.agent = Agent(settings=self.settings, kube=kube, desired=desired, vllm=vllm, metrics=self.metrics)  # type: ignore[arg-type]
        desired.on_change = self.agent.wake.set
        self.thread = threading.Thread(target=self.agent.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(timeout=10)


@pytest.fixture
def parts(tmp_path: pathlib.Path) -> Iterator[tuple[pathlib.Path, FakeVllm, MemoryKube, MemoryDesired]]:
    kube, desired = MemoryKube(), MemoryDesired()
    kube.secrets["tenant"] = dict(KEYS)
    desired.synced.set()
    yield tmp_path / "cache", FakeVllm(), kube, desired


def loaded(kube: MemoryKube, name: str) -> bool:
    return name in kube.status and kube.status[name][0].loaded


def test_a_refused_update_keeps_the_last_good_version_across_restarts(
    parts: tuple[pathlib.Path, FakeVllm, MemoryKube, MemoryDesired], s3_env: str, bucket: str
) -> None:
    cache, vllm, kube, desired = parts
    upload(s3_env, bucket, "a/", adapter_files(seed=1))
    loop = Loop(cache, vllm, kube, desired, resync_seconds=0.5)
    desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
    eventually(lambda: loaded(kube, "a"))
    good = kube.status["a"][0].version
    served = vllm.served["a"]
    upload(s3_env, bucket, "a/", adapter_files(rank=64, seed=2))  # a new version over the server's max rank
    eventually(lambda: kube.status["a"][0].rejected_version is not None)
    state = kube.status["a"][0]
    assert (state.loaded, state.version, state.reason) == (True, good, "UpdateRejected")
    assert "RankTooHigh" in (state.last_error or "") and vllm.served["a"] == served
    loop.stop()

    for fresh_vllm in (False, True):  # the agent restarts; then the whole pod (vLLM forgot its adapters)
        if fresh_vllm:
            vllm.served.clear()
        kube.status.clear()
        loop = Loop(cache, vllm, kube, desired, resync_seconds=0.5)
        eventually(lambda: loaded(kube, "a"))
        state = kube.status["a"][0]
        assert (state.version, state.reason, state.rejected_version) == (good, "UpdateRejected", state.rejected_version)
        assert state.rejected_version and vllm.served["a"] == served
        loop.stop()

    upload(s3_env, bucket, "a/", adapter_files(seed=3))  # fixed files: the refusal clears
    loop = Loop(cache, vllm, kube, desired, resync_seconds=0.5)
    eventually(lambda: loaded(kube, "a") and kube.status["a"][0].version not in (None, good))
    assert kube.status["a"][0].rejected_version is None and kube.status["a"][0].reason is None
    loop.stop()


def test_readiness_stops_waiting_and_the_status_follows_vllm(
    parts: tuple[pathlib.Path, FakeVllm, MemoryKube, MemoryDesired], s3_env: str, bucket: str
) -> None:
    cache, vllm, kube, desired = parts
    upload(s3_env, bucket, "good/", adapter_files(seed=1))
    upload(s3_env, bucket, "stuck/", adapter_files(seed=2))
    with FaultProxy(s3_env) as proxy:
        proxy.rules.append(Rule(match="stuck/", fault=Hang(seconds=30)))
        loop = Loop(cache, vllm, kube, desired, ready_wait_seconds=2.0, allowed_s3_endpoints=(proxy.url,))
        stuck = {"uri": f"s3://{bucket}/stuck/", "endpointUrl": proxy.url, "credentialsSecret": {"name": "tenant"}}
        desired.put("stuck", {"source": stuck})
        desired.put("good", {"source": {"uri": f"s3://{bucket}/good/"}})
        started = time.monotonic()
        eventually(lambda: loaded(kube, "good"), timeout=5)
        eventually(lambda: loop.agent.is_ready, timeout=5)
        ready_after = time.monotonic() - started
        assert ready_after < 4.0  # the wait, not the stuck adapter, decided
        assert loop.metrics.pending._value.get() == 1  # noqa: SLF001 - the gauge's value
        assert kube.status["stuck"][0].state.value in ("Downloading", "Pending")

        # Readiness closes before the status write that says vLLM is gone: record it at each write.
        publish, ready_at_write = loop.agent.publisher.publish, []

        def recording(*args: Any, **kwargs: Any) -> None:
            publish(*args, **kwargs)
            if not kube.status["good"][0].loaded:
                ready_at_write.append(loop.agent.is_ready)

        loop.agent.publisher.publish = recording  # type: ignore[method-assign]
        vllm.up = False  # vLLM died: at the next poll the entries say so and nothing claims Downloading
        went = time.monotonic()
        eventually(lambda: not kube.status["good"][0].loaded, timeout=5)
        noticed = time.monotonic() - went
        assert noticed <= loop.settings.poll_seconds + 0.5
        print(f"ready after {ready_after:.2f} s (wait 2 s, one adapter hanging); vLLM down noticed in {noticed:.2f} s")
        assert kube.status["good"][0].state.value == "Pending"
        assert ready_at_write and not any(ready_at_write)
        proxy.rules.clear()
        loop.stop()


def test_a_hanging_endpoint_delays_nobody_else_and_deletes_cancel(
    parts: tuple[pathlib.Path, FakeVllm, MemoryKube, MemoryDesired], s3_env: str, bucket: str
) -> None:
    cache, vllm, kube, desired = parts
    with FaultProxy(s3_env) as proxy:
        proxy.rules.append(Rule(match="/drip", fault=Drip(bytes_per_step=1, step_seconds=0.3)))
        loop = Loop(
            cache,
            vllm,
            kube,
            desired,
            download_workers=4,
            endpoint_workers=2,
            list_timeout_seconds=30.0,
            allowed_s3_endpoints=(proxy.url,),
        )
        for i in range(6):
            upload(s3_env, bucket, f"drip{i}/", adapter_files(seed=i))
            source = {
                "uri": f"s3://{bucket}/drip{i}/",
                "endpointUrl": proxy.url,
                "credentialsSecret": {"name": "tenant"},
            }
            desired.put(f"drip{i}", {"source": source})
        time.sleep(0.5)
        started = time.monotonic()
        for i in range(4):
            upload(s3_env, bucket, f"good{i}/", adapter_files(seed=10 + i))
            desired.put(f"good{i}", {"source": {"uri": f"s3://{bucket}/good{i}/"}})
        eventually(lambda: all(loaded(kube, f"good{i}") for i in range(4)), timeout=10)
        assert time.monotonic() - started < 3.0
        assert loop.agent.preparer.gates.holders(proxy.url) <= 2
        for i in range(6):  # deleted while their listings drip: their preparations are cancelled
            desired.items.pop(f"drip{i}")
        desired.on_change()
        eventually(lambda: not loop.agent.busy, timeout=5)
        assert not [p for p in cache.iterdir() if p.name.startswith(".part-")]
        proxy.rules.clear()
        loop.stop()


def test_the_poll_of_a_dead_vllm_answers_at_once() -> None:
    from moelora.agent.serve.vllm import VllmClient
    from moelora.local import process

    client = VllmClient(base_url=f"http://127.0.0.1:{process.free_port()}")  # retries 3 times for loads
    started = time.monotonic()
    with pytest.raises(TransientError):
        client.adapters(poll=0.2)
    assert time.monotonic() - started < 0.5  # one try: no backoff between polls


def test_markers_of_adapters_deleted_while_away_are_dropped_at_start(
    parts: tuple[pathlib.Path, FakeVllm, MemoryKube, MemoryDesired],
) -> None:
    from moelora.agent.store.last_good import LastGood, Served

    cache, vllm, kube, desired = parts
    (cache / "v-gone").mkdir(parents=True)
    markers = LastGood(cache)
    markers.remember("uid-gone", Served(version="v-gone", path=str(cache / "v-gone")))
    assert markers.versions() == {"v-gone"}
    loop = Loop(cache, vllm, kube, desired)
    eventually(lambda: markers.versions() == set(), timeout=5)
    loop.stop()
