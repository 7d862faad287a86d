"""Adapters' phases through the real operator: rolled up from the agents' reports and the server's pods, and
counted on the server at once, not at the next resync.

The operator's adapter index learns a phase the operator itself wrote only when that write's watch event comes
back, so counting from the index right after the write would report the old phase. The resync timer is set to an
hour here so that it cannot hide such a stale count (nor any other change that arrives only by resync).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread
from moelora.operator.settings import Settings

from .cluster import DEPLOYMENTS, LORA, MS, apply, condition, make_ready, manifest, patch_status, server_pod, wait_for
from .conftest import running_operator

NS = "counts"
POD_FIRST = "counts-pod-first"
# What the pod's agent reports once it has loaded the adapter.
LOADED_ON_THE_POD = {"replicas": {"qwen-moe-abc": {"loaded": True, "state": "Loaded"}}}


@pytest.fixture(scope="module", autouse=True)
def operator(kube: KubeAPI) -> Iterator[OperatorThread]:
    with running_operator(kube) as running:
        yield running


def adapter_counts(kube: KubeAPI, namespace: str = NS) -> dict | None:
    return ((kube.get(MS, namespace, "qwen-moe") or {}).get("status") or {}).get("adapters")


def wait_for_counts(kube: KubeAPI, namespace: str, want: dict, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while adapter_counts(kube, namespace) != want:
        assert time.monotonic() < deadline, f"stale count: {adapter_counts(kube, namespace)}, want {want}"
        time.sleep(0.05)


def apply_examples(kube: KubeAPI, namespace: str) -> None:
    for name in ("modelserver.yaml", "loraadapter.yaml"):
        apply(kube, manifest(name, namespace=namespace))


def test_loaded_count_follows_the_agents_report_without_a_resync(kube: KubeAPI) -> None:
    apply_examples(kube, NS)
    apply(kube, server_pod(NS))
    make_ready(kube, NS)
    wait_for_counts(kube, NS, {"desired": 1, "loaded": 0, "failed": 0}, timeout=10)

    # The pod's agent reports the adapter loaded; the operator rolls it up to Loaded and must count it.
    patch_status(kube, "lora", "support-bot", NS, LOADED_ON_THE_POD)
    wait_for_counts(kube, NS, {"desired": 1, "loaded": 1, "failed": 0}, timeout=5)


def test_loaded_count_follows_the_pod_turning_ready_without_a_resync(kube: KubeAPI) -> None:
    # The agent loads adapters before its pod is Ready (readiness waits for them): the adapter becomes Loaded
    # through the pod's readiness event, not through an adapter event.
    apply_examples(kube, POD_FIRST)
    apply(kube, server_pod(POD_FIRST))
    patch_status(kube, "lora", "support-bot", POD_FIRST, LOADED_ON_THE_POD)
    wait_for_counts(kube, POD_FIRST, {"desired": 1, "loaded": 0, "failed": 0}, timeout=10)
    make_ready(kube, POD_FIRST)
    wait_for_counts(kube, POD_FIRST, {"desired": 1, "loaded": 1, "failed": 0}, timeout=5)


def test_adapter_phase_and_server_counts_roll_up(kube: KubeAPI) -> None:
    ns = "adapters"
    apply(kube, manifest("modelserver.yaml", namespace=ns))
    wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment")
    apply(kube, manifest("loraadapter.yaml", namespace=ns))
    pending = wait_for(
        lambda: (a := kube.get(LORA, ns, "support-bot")) and a.get("status", {}).get("phase") and a, what="a phase"
    )
    assert pending["status"]["phase"] == "Pending" and pending["status"]["servedName"] == "support-bot"

    orphan = manifest("loraadapter.yaml", namespace=ns, modelServer="no-such-server")
    orphan["metadata"]["name"] = "orphan"
    apply(kube, orphan)
    lost = wait_for(lambda: (c := condition(kube.get(LORA, ns, "orphan"), "Ready")) and c, what="orphan condition")
    assert lost["reason"] == "ModelServerNotFound"
    assert kube.get(LORA, ns, "orphan")["status"]["phase"] == "Failed"

    # A ready pod of the server (what the kubelet would report), and its agent's report.
    apply(kube, server_pod(ns))
    make_ready(kube, ns)
    patch_status(
        kube,
        "lora",
        "support-bot",
        ns,
        {"replicas": {"qwen-moe-abc": {"loaded": True, "state": "Loaded"}, "gone-pod": {"state": "Failed"}}},
    )
    loaded = wait_for(
        lambda: (a := kube.get(LORA, ns, "support-bot")) and a["status"].get("phase") == "Loaded" and a, what="Loaded"
    )
    assert "gone-pod" not in loaded["status"]["replicas"]  # pruned: that pod does not exist
    assert condition(loaded, "Ready")["status"] == "True"
    counts = wait_for(
        lambda: (
            (s := kube.get(MS, ns, "qwen-moe")) and s["status"]["adapters"]["loaded"] == 1 and s["status"]["adapters"]
        ),
        what="server adapter counts",
    )
    assert counts == {"desired": 1, "loaded": 1, "failed": 0}

    # The pod goes away: its entry is pruned and the adapter waits for a ready pod again.
    kube.kubectl("delete", "pod", "qwen-moe-abc", "-n", ns)
    again = wait_for(
        lambda: (a := kube.get(LORA, ns, "support-bot")) and a["status"].get("phase") == "Pending" and a,
        what="Pending again",
    )
    assert again["status"].get("replicas", {}) == {}

    # The server goes away: its adapters say so.
    kube.kubectl("delete", "ms", "qwen-moe", "-n", ns)
    gone = wait_for(
        lambda: (
            (c := condition(kube.get(LORA, ns, "support-bot"), "Ready")) and c["reason"] == "ModelServerNotFound" and c
        ),
        what="ModelServerNotFound after deletion",
    )
    assert gone["status"] == "False" and kube.get(LORA, ns, "support-bot")["status"]["phase"] == "Failed"


def test_a_recount_writes_only_the_counts_and_only_when_they_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter's phase change rewrites `status.adapters` alone: one read of the server, no child read, and no
    write when the counts are already right."""
    import concurrent.futures

    from moelora.operator.control import model_servers
    from moelora.operator.control.context import Context
    from moelora.operator.decide.indexes import AdapterEntry
    from moelora.operator.kube import apply

    stored = {"metadata": {"name": "srv", "namespace": "ns"}, "status": {"adapters": {"desired": 2, "loaded": 1}}}
    reads: list[str] = []
    writes: list[dict] = []
    monkeypatch.setattr(apply, "get_model_server", lambda **kw: reads.append(kw["name"]) or stored)
    monkeypatch.setattr(apply, "patch_status", lambda **kw: writes.append(kw["status"]) or stored)
    memo = Context(settings=Settings(), kernel_bundle=None, api=None, executor=concurrent.futures.ThreadPoolExecutor(1))
    memo.executor.shutdown()
    phases = [AdapterEntry(name="a", phase="Loaded"), AdapterEntry(name="b", phase="Failed")]
    model_servers.write_counts(memo=memo, key=("ns", "srv"), adapters=phases)
    assert writes == [{"adapters": {"desired": 2, "loaded": 1, "failed": 1}}] and reads == ["srv"]
    stored["status"]["adapters"] = writes[0]["adapters"]
    model_servers.write_counts(memo=memo, key=("ns", "srv"), adapters=phases)
    assert len(writes) == 1 and reads == ["srv", "srv"]
