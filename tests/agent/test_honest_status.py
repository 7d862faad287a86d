"""What the agent's status entries say while nothing changes in vLLM: a re-check keeps an adapter Loaded with the
same loadedAt, a retry keeps the last failure's reason, and a load whose output is not finite never says Loaded."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.agent.check.validate import AdapterInfo
from moelora.agent.reconcile import CANARY_PREFIX
from moelora.api import ReplicaAdapterState
from moelora.local.faults import FaultProxy, Hang, Rule

from .conftest import KEYS, FakeVllm, MemoryDesired, MemoryKube, adapter_files, eventually, upload
from .test_faults_loop import Loop as AgentLoop


class HistoryKube(MemoryKube):
    """MemoryKube that also keeps every status write, in order, per adapter."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[ReplicaAdapterState]] = {}

    def patch_replica(self, *, name: str, pod: str, state: ReplicaAdapterState, info: AdapterInfo | None) -> bool:
        with self.lock:
            self.history.setdefault(name, []).append(state)
        return super().patch_replica(name=name, pod=pod, state=state, info=info)


class Loop(AgentLoop):
    """The agent's loop over its own HistoryKube, desired set and vLLM (conftest's, which runs output checks)."""

    def __init__(self, cache: pathlib.Path, **changes: Any) -> None:
        self.kube, self.desired, self.vllm = HistoryKube(), MemoryDesired(), FakeVllm()
        self.kube.secrets["tenant"] = dict(KEYS)
        self.desired.synced.set()
        super().__init__(cache, self.vllm, self.kube, self.desired, **changes)  # type: ignore[arg-type]

    def state(self, name: str) -> ReplicaAdapterState | None:
        entry = self.kube.status.get(name)
        return entry[0] if entry else None

    def loaded(self, name: str) -> bool:
        state = self.state(name)
        return state is not None and state.loaded

    def idle(self) -> bool:
        return not self.agent.busy and not any(getattr(r, "checking", False) for r in self.agent.records.values())


@pytest.fixture
def loop(tmp_path: pathlib.Path, s3_env: str) -> Iterator[Loop]:
    running = Loop(tmp_path / "cache")
    yield running
    running.stop()


def test_a_spec_change_with_the_same_files_keeps_it_loaded_since_the_same_time(
    loop: Loop, s3_env: str, bucket: str
) -> None:
    files = adapter_files(seed=1)
    upload(s3_env, bucket, "a/", files)
    upload(s3_env, bucket, "copy/", files)  # the same bytes: the same ETags, the same version
    loop.desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
    eventually(lambda: loop.loaded("a"))
    first = loop.state("a")
    assert first is not None and first.loaded_at is not None
    writes = len(loop.kube.history["a"])

    loop.desired.put("a", {"source": {"uri": f"s3://{bucket}/copy/"}})  # a spec change: checked again
    eventually(lambda: loop.agent.records["uid-a"].spec_hash == loop.desired.items["a"].spec_hash and loop.idle())
    after = loop.kube.history["a"][writes:]
    assert all(state.loaded for state in after), [state.state.value for state in after]
    now = loop.state("a")
    assert now is not None and now.loaded and now.loaded_at == first.loaded_at and now.version == first.version
    assert [call for call in loop.vllm.calls if call[0] == "load"] == [("load", "a", loop.vllm.served["a"], False)]


def test_a_spec_change_to_new_files_loads_them_in_place_without_saying_unloaded(
    loop: Loop, s3_env: str, bucket: str
) -> None:
    upload(s3_env, bucket, "a/", adapter_files(seed=1))
    upload(s3_env, bucket, "b/", adapter_files(seed=2))
    loop.desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
    eventually(lambda: loop.loaded("a"))
    first = loop.state("a")
    assert first is not None
    writes = len(loop.kube.history["a"])

    loop.desired.put("a", {"source": {"uri": f"s3://{bucket}/b/"}})
    eventually(lambda: (state := loop.state("a")) is not None and state.version not in (None, first.version))
    after = loop.kube.history["a"][writes:]
    assert all(state.loaded for state in after), [state.state.value for state in after]
    assert loop.vllm.calls[-1][0] == "load" and loop.vllm.calls[-1][3]  # in place: no gap in serving


def test_a_retrying_adapter_keeps_its_last_reason_and_message(tmp_path: pathlib.Path, s3_env: str, bucket: str) -> None:
    upload(s3_env, bucket, "stuck/", adapter_files(seed=2))
    with FaultProxy(s3_env) as proxy:
        proxy.rules.append(Rule(match="stuck/", fault=Hang(seconds=3)))
        loop = Loop(tmp_path / "cache", allowed_s3_endpoints=(proxy.url,))
        try:
            source = {"uri": f"s3://{bucket}/stuck/", "endpointUrl": proxy.url, "credentialsSecret": {"name": "tenant"}}
            loop.desired.put("stuck", {"source": source})
            eventually(lambda: (r := loop.agent.records.get("uid-stuck")) is not None and r.attempts >= 3, timeout=30)
        finally:
            proxy.rules.clear()
            loop.stop()
    history = loop.kube.history["stuck"]
    first = next(i for i, state in enumerate(history) if state.reason is not None)
    retrying = history[first:]
    assert len(retrying) >= 2, [s.state.value for s in history]  # failed, retried (Downloading), failed again...
    assert all(s.reason == "EndpointUnreachable" and s.last_error for s in retrying), [
        (s.state.value, s.reason) for s in retrying
    ]
    assert any(s.state.value == "Downloading" for s in retrying)  # the retry itself, with the reason kept


def test_a_load_whose_output_is_not_finite_fails_and_is_never_served(loop: Loop, s3_env: str, bucket: str) -> None:
    upload(s3_env, bucket, "nan/", adapter_files(seed=3))
    loop.vllm.non_finite = _NonFiniteAll()
    loop.desired.put("nan", {"source": {"uri": f"s3://{bucket}/nan/"}})
    eventually(lambda: (state := loop.state("nan")) is not None and state.state.value == "Failed")
    state = loop.state("nan")
    assert state is not None and state.reason == "OutputNonFinite" and "nan" in (state.last_error or "")
    assert not any(s.loaded for s in loop.kube.history["nan"])
    assert loop.vllm.calls == [] and loop.vllm.served == {} and len(loop.vllm.checks) == 1
    assert not loop.vllm._checking  # the check's own name was unloaded  # noqa: SLF001


def test_an_update_whose_output_is_not_finite_is_refused_and_the_last_good_version_keeps_serving(
    tmp_path: pathlib.Path, s3_env: str, bucket: str
) -> None:
    loop = Loop(tmp_path / "cache", resync_seconds=0.5)
    try:
        upload(s3_env, bucket, "a/", adapter_files(seed=1))
        loop.desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
        eventually(lambda: loop.loaded("a"))
        good = loop.state("a")
        assert good is not None
        served, writes = loop.vllm.served["a"], len(loop.kube.history["a"])
        loop.vllm.non_finite = _NonFiniteAll(except_path=served)
        upload(s3_env, bucket, "a/", adapter_files(seed=4))  # a new version, found by the resync
        eventually(lambda: (state := loop.state("a")) is not None and state.rejected_version is not None)
        state = loop.state("a")
        assert state is not None and (state.loaded, state.reason) == (True, "UpdateRejected")
        assert state.version == good.version
        assert "OutputNonFinite" in (state.last_error or "") and state.loaded_at == good.loaded_at
        assert loop.vllm.served == {"a": served} and all(s.loaded for s in loop.kube.history["a"][writes:])
        checks = len(loop.vllm.checks)
        loop.vllm.served.clear()  # vLLM restarted: the served files come back, without another check
        eventually(lambda: loop.vllm.served.get("a") == served)
        assert len(loop.vllm.checks) == checks
    finally:
        loop.stop()


class _NonFiniteAll(set[str]):
    """Every path fails the output check, but one."""

    def __init__(self, except_path: str | None = None) -> None:
        super().__init__()
        self.except_path = except_path

    def __contains__(self, path: object) -> bool:
        return path != self.except_path


def test_a_check_left_loaded_in_vllm_is_unloaded_as_the_agents_own(loop: Loop) -> None:
    loop.vllm.served = {CANARY_PREFIX + "0123456789abcdef": "/var/lib/moelora/adapters/x"}  # its unload failed once
    eventually(lambda: not loop.vllm.served)
    time.sleep(0.5)  # a foreign adapter's Event is written from a pool: give it time to show
    assert loop.kube.events == []  # not reported as a foreign adapter
