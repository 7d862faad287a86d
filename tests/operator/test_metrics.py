"""The operator's metrics: what the real operator's /metrics exposes after some work, compared with the table
of docs/reference.md both ways, with no label that names an object."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from moelora.local import process
from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread
from moelora.operator.control import metrics
from moelora.operator.control.metrics import Metrics
from moelora.operator.errors import SpecProblem
from moelora.operator.settings import Settings

from ..metrics_readme import exposed_metrics, readme_metrics
from .cluster import apply, manifest, patch_status, server_pod, wait_for

NS = "metered"
PORT = process.free_port()


@pytest.fixture(scope="module")
def kube(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[KubeAPI]:
    monkeypatch_module.setattr(metrics, "REFRESH_SECONDS", 0.1)
    with KubeAPI() as api:
        settings = Settings(
            server_image="example.com/server:1",
            agent_image="example.com/agent:1",
            kubeconfig=str(api.kubeconfig),
            resync_seconds=3600.0,
            metrics_port=PORT,
            metrics_host="127.0.0.1",
        )
        with OperatorThread(settings=settings):
            yield api


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def scrape() -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as response:
        return {family.name: family for family in text_string_to_metric_families(response.read().decode())}


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    """The sum of the samples `name` (as queried) with these labels."""
    samples = [sample for family in families.values() for sample in family.samples]
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def test_exposition_matches_the_readme_table_both_ways(kube: KubeAPI) -> None:
    # A server with an adapter failing on its pod, and a server whose spec the operator refuses (a problem).
    for name in ("modelserver.yaml", "loraadapter.yaml"):
        apply(kube, manifest(name, namespace=NS))
    apply(kube, server_pod(NS))
    failing = {"qwen-moe-abc": {"loaded": False, "state": "Failed", "reason": "RankTooHigh", "lastError": "r=64"}}
    patch_status(kube, "lora", "support-bot", NS, {"replicas": failing})
    typo = manifest("modelserver.yaml", namespace=NS, engineArgs=["--max-modle-len=8192"])
    typo["metadata"]["name"] = "typo"
    apply(kube, typo)

    def settled() -> dict[str, Any] | None:
        families = scrape()
        done = (
            value(families, "moelora_operator_lora_adapters", phase="Failed") == 1
            and value(families, "moelora_operator_errors_total", reason="UnknownEngineFlag") >= 1
            and value(families, "moelora_operator_model_servers") == 2
        )
        return families if done else None

    families = wait_for(settled, what="the gauges and counters")
    assert value(families, "moelora_operator_reconciles_total", resource="ModelServer", result="success") >= 1
    assert value(families, "moelora_operator_reconciles_total", resource="LoRAAdapter", result="success") >= 1
    assert value(families, "moelora_operator_children", kind="Deployment") == 1  # typo's is never applied
    assert value(families, "moelora_operator_reconcile_duration_seconds_count", resource="ModelServer") >= 2
    assert exposed_metrics(list(families.values())) == readme_metrics("The operator")

    # Bounded cardinality: no label value names an object.
    names = {"qwen-moe", "typo", "support-bot", "qwen-moe-abc", NS}
    values = {v for family in families.values() for sample in family.samples for v in sample.labels.values()}
    assert values & names == set()
    assert not [s for family in families.values() for s in family.samples if s.name.endswith("_created")]


def test_timed_counts_problems_and_exceptions() -> None:
    class Memo:
        metrics = Metrics()

    @metrics.timed("ModelServer")
    def reconcile(*, memo: Any, outcome: str) -> SpecProblem | None:
        if outcome == "boom":
            raise KeyError(outcome)
        return SpecProblem("SecretNotFound", "x") if outcome == "problem" else None

    for outcome in ("ok", "problem"):
        reconcile(memo=Memo, outcome=outcome)
    with pytest.raises(KeyError):
        reconcile(memo=Memo, outcome="boom")
    registry = Memo.metrics.registry
    for result in ("success", "problem", "error"):
        labels = {"resource": "ModelServer", "result": result}
        assert registry.get_sample_value("moelora_operator_reconciles_total", labels) == 1
    assert registry.get_sample_value("moelora_operator_errors_total", {"reason": "KeyError"}) == 1
    assert registry.get_sample_value("moelora_operator_errors_total", {"reason": "SecretNotFound"}) == 1


def test_children_of_a_gone_server_read_zero() -> None:
    gauges = Metrics()
    gauges.set_children(("n", "a"), ["Deployment", "Service", "PodDisruptionBudget"])
    gauges.set_children(("n", "b"), ["Deployment", "Service"])
    gauges.set_children(("n", "a"), None)
    kinds = ("Deployment", "Service", "PodDisruptionBudget")
    read = {kind: gauges.registry.get_sample_value("moelora_operator_children", {"kind": kind}) for kind in kinds}
    assert read == {"Deployment": 1, "Service": 1, "PodDisruptionBudget": 0}
