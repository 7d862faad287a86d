"""vLLM's health watched between polls: a vLLM that dies shows as not loaded within a second even with a long poll,
and one that comes back gets its adapters again at once (issue 17's "status within seconds"), against a fake vLLM
over HTTP (benchmarks/chaos_pods.py) that can die and come back on the same port."""

from __future__ import annotations

import pathlib
import sys
import threading
import time

from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.agent.serve.vllm import HealthWatch, VllmClient

from .conftest import MemoryDesired, MemoryKube, adapter_files, agent_settings, eventually, upload

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
from chaos_pods import FakeVllm  # noqa: E402


def test_check_reports_changes_only() -> None:
    vllm = FakeVllm().start()
    woken = []
    watch = HealthWatch(VllmClient(base_url=vllm.url), on_change=lambda: woken.append(1))
    assert watch.check() and watch.healthy is True
    assert not watch.check()
    vllm.stop()
    assert watch.check() and watch.healthy is False and len(woken) == 2
    assert not watch.check()


def test_a_dead_vllm_shows_within_a_second_and_a_back_one_gets_its_adapters(
    s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    vllm = FakeVllm().start()
    poll = 30.0  # the loop's own poll alone would take this long to notice
    settings = agent_settings(tmp_path / "cache", vllm_url=vllm.url, poll_seconds=poll)
    kube, desired = MemoryKube(), MemoryDesired()
    client = VllmClient(base_url=vllm.url, attempts=1)
    agent = Agent(settings=settings, kube=kube, desired=desired, vllm=client, metrics=Metrics())
    desired.on_change = agent.wake.set
    desired.synced.set()
    watch = HealthWatch(client, on_change=agent.wake.set, interval=0.2)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    watch.start()
    try:
        upload(s3_env, bucket, "a/", adapter_files(seed=1))
        desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
        eventually(lambda: "a" in kube.status and kube.status["a"][0].loaded, timeout=30)

        vllm.stop()  # killed: the port refuses
        killed = time.monotonic()
        eventually(lambda: not kube.status["a"][0].loaded, timeout=poll / 2)
        gone = time.monotonic() - killed
        vllm = FakeVllm(port=vllm.port).start()  # restarted, knowing no adapter
        back = time.monotonic()
        eventually(lambda: "a" in vllm.adapters and kube.status["a"][0].loaded, timeout=poll / 2)
        again = time.monotonic() - back
        print(f"not loaded {gone:.2f} s after the kill; registered again {again:.2f} s after vLLM was back")
        assert gone < 1.5 and again < 1.5
    finally:
        watch.stop()
        agent.stop()
        thread.join(timeout=10)
        vllm.stop()
