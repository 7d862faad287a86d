"""LoRAAdapter Events through the real operator, read with kubectl: one per phase transition of the roll-up, and an
identical failure that comes back raises the count of its Event instead of adding one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread

from .cluster import LORA, apply, make_ready, manifest, patch_status, server_pod, wait_for
from .conftest import running_operator

POD = "qwen-moe-abc"
DENIED = {"loaded": False, "state": "Failed", "reason": "AccessDenied", "lastError": "s3: 403 on GetObject"}
RETRYING = {"loaded": False, "state": "Downloading"}
LOADED = {"loaded": True, "state": "Loaded"}


@pytest.fixture(scope="module", autouse=True)
def operator(kube: KubeAPI) -> Iterator[OperatorThread]:
    with running_operator(kube) as running:
        yield running


def adapter_events(kube: KubeAPI, namespace: str) -> list[dict[str, Any]]:
    """`kubectl get events` of the namespace, those about LoRAAdapters."""
    listed = json.loads(kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    return [event for event in listed if event["involvedObject"]["kind"] == "LoRAAdapter"]


def phase(kube: KubeAPI, namespace: str) -> str | None:
    return ((kube.get(LORA, namespace, "support-bot") or {}).get("status") or {}).get("phase")


def report(kube: KubeAPI, namespace: str, state: dict[str, Any], want: str) -> None:
    """What the pod's agent writes, then the roll-up the operator judges from it."""
    patch_status(kube, "lora", "support-bot", namespace, {"replicas": {POD: state}})
    wait_for(lambda: phase(kube, namespace) == want or None, what=want)


def served_adapter(kube: KubeAPI, namespace: str) -> None:
    for name in ("modelserver.yaml", "loraadapter.yaml"):
        apply(kube, manifest(name, namespace=namespace))
    apply(kube, server_pod(namespace))
    make_ready(kube, namespace)
    wait_for(lambda: phase(kube, namespace) == "Pending" or None, what="Pending")


def test_a_failure_is_one_warning_and_its_return_raises_the_count(kube: KubeAPI) -> None:
    ns = "fails"
    served_adapter(kube, ns)
    report(kube, ns, DENIED, "Failed")
    warnings = wait_for(lambda: [e for e in adapter_events(kube, ns) if e["type"] == "Warning"] or None, what="Event")
    assert len(warnings) == 1
    first = warnings[0]
    assert first["reason"] == "AccessDenied" and first["message"] == f"{POD}: s3: 403 on GetObject"
    assert first["involvedObject"]["name"] == "support-bot" and first["source"]["component"] == "moelora-operator"

    # The agent retries and fails the same way again: the same Event, counted, not a second one.
    report(kube, ns, RETRYING, "Downloading")
    report(kube, ns, DENIED, "Failed")

    def counted() -> list[dict[str, Any]] | None:
        warnings = [e for e in adapter_events(kube, ns) if e["type"] == "Warning"]
        return warnings if warnings[0]["count"] > first["count"] else None

    warnings = wait_for(counted, what="the count raised")
    assert [e["metadata"]["name"] for e in warnings] == [first["metadata"]["name"]]
    assert warnings[0]["lastTimestamp"] >= first["lastTimestamp"]

    described = kube.kubectl("describe", "lora", "support-bot", "-n", ns).stdout
    events_section = described.split("\nEvents:", 1)[1]
    line = next(line for line in events_section.splitlines() if "AccessDenied" in line)
    assert "Warning" in line and f"(x{warnings[0]['count']} over" in line and "moelora-operator" in line


def test_loaded_unloaded_and_deleted_are_normal_events_once_per_adapter(kube: KubeAPI) -> None:
    ns = "loads"
    served_adapter(kube, ns)
    report(kube, ns, LOADED, "Loaded")
    loaded = wait_for(lambda: [e for e in adapter_events(kube, ns) if e["reason"] == "Loaded"] or None, what="Loaded")
    assert [(e["type"], e["message"], e["count"]) for e in loaded] == [("Normal", "loaded on 1/1 replicas", 1)]

    # The agent reloads it (a new version): no longer loaded everywhere, then loaded again, counted.
    report(kube, ns, RETRYING, "Downloading")
    report(kube, ns, LOADED, "Loaded")
    wait_for(lambda: [e for e in adapter_events(kube, ns) if e["reason"] == "Loaded" and e["count"] == 2], what="x2")

    kube.kubectl("delete", "lora", "support-bot", "-n", ns)
    wait_for(lambda: [e for e in adapter_events(kube, ns) if e["reason"] == "Deleted"] or None, what="Deleted")
    assert sorted(e["reason"] for e in adapter_events(kube, ns)) == ["Deleted", "Loaded", "Unloaded"]
