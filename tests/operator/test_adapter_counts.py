"""A server's adapter counts follow its adapters' phases at once, not at the next resync.

The operator's adapter index learns a phase the operator itself wrote only when that write's watch event comes
back, so counting from the index right after the write would report the old phase. The resync timer is set to an
hour here so that it cannot hide such a stale count.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Iterator

import pytest
import yaml

from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread
from moelora.operator.settings import Settings

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
MS = "moelora.io/v1alpha1/modelservers"
NS = "counts"
POD_FIRST = "counts-pod-first"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        settings = Settings(
            server_image="example.com/server:1",
            agent_image="example.com/agent:1",
            kubeconfig=str(api.kubeconfig),
            resync_seconds=3600.0,
        )
        with OperatorThread(settings=settings):
            yield api


def apply(kube: KubeAPI, obj: dict) -> None:
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(obj))


def adapter_counts(kube: KubeAPI, namespace: str = NS) -> dict | None:
    return ((kube.get(MS, namespace, "qwen-moe") or {}).get("status") or {}).get("adapters")


def wait_for_counts(kube: KubeAPI, namespace: str, want: dict, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while adapter_counts(kube, namespace) != want:
        assert time.monotonic() < deadline, f"stale count: {adapter_counts(kube, namespace)}, want {want}"
        time.sleep(0.05)


def server_pod(namespace: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "qwen-moe-abc",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "moelora", "moelora.io/model-server": "qwen-moe"},
        },
        "spec": {"containers": [{"name": "vllm", "image": "x"}]},
    }


def make_ready(kube: KubeAPI, namespace: str) -> None:
    kube.kubectl(
        "patch",
        "pod",
        "qwen-moe-abc",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    )


def apply_examples(kube: KubeAPI, namespace: str) -> None:
    for name in ("modelserver.yaml", "loraadapter.yaml"):
        obj = yaml.safe_load((EXAMPLES / name).read_text())
        obj["metadata"]["namespace"] = namespace
        apply(kube, obj)


def test_loaded_count_follows_the_agents_report_without_a_resync(kube: KubeAPI) -> None:
    apply_examples(kube, NS)
    apply(kube, server_pod(NS))
    make_ready(kube, NS)
    wait_for_counts(kube, NS, {"desired": 1, "loaded": 0, "failed": 0}, timeout=10)

    # The pod's agent reports the adapter loaded; the operator rolls it up to Loaded and must count it.
    kube.kubectl(
        "patch",
        "lora",
        "support-bot",
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"replicas": {"qwen-moe-abc": {"loaded": True, "state": "Loaded"}}}}),
    )
    wait_for_counts(kube, NS, {"desired": 1, "loaded": 1, "failed": 0}, timeout=5)


def test_loaded_count_follows_the_pod_turning_ready_without_a_resync(kube: KubeAPI) -> None:
    # The agent loads adapters before its pod is Ready (readiness waits for them): the adapter becomes Loaded
    # through the pod's readiness event, not through an adapter event.
    apply_examples(kube, POD_FIRST)
    apply(kube, server_pod(POD_FIRST))
    kube.kubectl(
        "patch",
        "lora",
        "support-bot",
        "-n",
        POD_FIRST,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"replicas": {"qwen-moe-abc": {"loaded": True, "state": "Loaded"}}}}),
    )
    wait_for_counts(kube, POD_FIRST, {"desired": 1, "loaded": 0, "failed": 0}, timeout=10)
    make_ready(kube, POD_FIRST)
    wait_for_counts(kube, POD_FIRST, {"desired": 1, "loaded": 1, "failed": 0}, timeout=5)


async def test_concurrent_phase_changes_are_all_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two adapters fail at once; the index has seen neither write yet. Whichever reconcile runs last must count
    both: it reads the phases under the server's lock, with every phase the operator has written so far."""
    import asyncio
    import concurrent.futures
    import threading
    from types import SimpleNamespace

    from moelora.operator import handlers

    key = ("ns", "srv")
    index = {key: [{"name": "a", "phase": "Pending"}, {"name": "b", "phase": "Pending"}]}
    seen: list[dict[str, str]] = []
    first_started, release_first = threading.Event(), threading.Event()

    def fake_reconcile(body, *, memo, adapters):  # holds the lock until the second recount is queued behind it
        seen.append({entry["name"]: entry["phase"] for entry in adapters})
        if len(seen) == 1:
            first_started.set()
            release_first.wait(5)

    monkeypatch.setattr(handlers, "reconcile", fake_reconcile)
    memo = SimpleNamespace(
        pool=concurrent.futures.ThreadPoolExecutor(2), locks={key: asyncio.Lock()}, written_phases={key: {}}
    )
    server = {"metadata": {"namespace": "ns", "name": "srv"}}
    first = asyncio.create_task(
        handlers.recount([server], key, memo=memo, adapters_index=index, new_phases={"a": "Failed"})
    )
    await asyncio.get_running_loop().run_in_executor(None, first_started.wait, 5)
    second = asyncio.create_task(
        handlers.recount([server], key, memo=memo, adapters_index=index, new_phases={"b": "Failed"})
    )
    await asyncio.sleep(0.05)
    release_first.set()
    await asyncio.gather(first, second)
    memo.pool.shutdown()
    assert seen[-1] == {"a": "Failed", "b": "Failed"}, seen
