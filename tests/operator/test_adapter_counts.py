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

from moelora.local.kube import KubeAPI, OperatorThread
from moelora.operator.settings import Settings

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
MS = "moelora.io/v1alpha1/modelservers"
NS = "counts"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        settings = Settings(server_image="example.com/server:1", agent_image="example.com/agent:1",
                            kubeconfig=str(api.kubeconfig), resync_seconds=3600.0)
        with OperatorThread(settings=settings):
            yield api


def apply(kube: KubeAPI, obj: dict) -> None:
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(obj))


def adapter_counts(kube: KubeAPI) -> dict | None:
    return ((kube.get(MS, NS, "qwen-moe") or {}).get("status") or {}).get("adapters")


def test_loaded_count_follows_the_agents_report_without_a_resync(kube: KubeAPI) -> None:
    for name in ("modelserver.yaml", "loraadapter.yaml"):
        obj = yaml.safe_load((EXAMPLES / name).read_text())
        obj["metadata"]["namespace"] = NS
        apply(kube, obj)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "qwen-moe-abc", "namespace": NS, "labels": {
        "app.kubernetes.io/managed-by": "moelora", "moelora.io/model-server": "qwen-moe"}},
        "spec": {"containers": [{"name": "vllm", "image": "x"}]}}
    apply(kube, pod)
    kube.kubectl("patch", "pod", "qwen-moe-abc", "-n", NS, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}))

    deadline = time.monotonic() + 10
    while (adapter_counts(kube) or {}).get("desired") != 1:
        assert time.monotonic() < deadline, f"the server never counted its adapter: {adapter_counts(kube)}"
        time.sleep(0.05)
    assert adapter_counts(kube) == {"desired": 1, "loaded": 0, "failed": 0}

    # The pod's agent reports the adapter loaded; the operator rolls it up to Loaded and must count it.
    kube.kubectl("patch", "lora", "support-bot", "-n", NS, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"replicas": {"qwen-moe-abc": {"loaded": True, "state": "Loaded"}}}}))
    deadline = time.monotonic() + 5
    while (adapter_counts(kube) or {}).get("loaded") != 1:
        assert time.monotonic() < deadline, f"stale count: {adapter_counts(kube)}"
        time.sleep(0.05)
    assert adapter_counts(kube) == {"desired": 1, "loaded": 1, "failed": 0}
