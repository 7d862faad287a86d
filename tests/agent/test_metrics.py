"""The agent's metrics, as docs/reference.md documents them, and the status server's three endpoints."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from moelora.agent.report.metrics import Metrics, StatusServer

from ..metrics_readme import REFERENCE, exposed_metrics, readme_metrics


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, "", error.read().decode()


def test_endpoints_follow_their_callbacks() -> None:
    metrics = Metrics()
    state = {"ready": False, "alive": True}
    server = StatusServer(
        port=0, host="127.0.0.1", metrics=metrics, ready=lambda: state["ready"], alive=lambda: state["alive"]
    )
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert fetch(base + "/readyz")[0] == 503 and fetch(base + "/healthz")[0] == 200
        state.update(ready=True, alive=False)
        assert fetch(base + "/readyz")[0] == 200 and fetch(base + "/healthz")[0] == 503
        metrics.loaded.labels("a", "team/a").set(1)
        status, content_type, body = fetch(base + "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert 'moelora_adapter_loaded{adapter="a",served_name="team/a"} 1.0' in body
        assert fetch(base + "/nothing")[0] == 404
    finally:
        server.stop()


def test_forget_drops_every_series_of_a_deleted_adapter() -> None:
    metrics = Metrics()
    for name in ("gone", "kept"):
        metrics.loaded.labels(name, name).set(1)
        metrics.on_demand.labels(name).set(1)
        metrics.downloaded.labels(name).inc(100)
        metrics.failures.labels(name, "SourceNotFound").inc()
        metrics.failures.labels(name, "RankTooHigh").inc()
    metrics.forget(adapter="gone", served_name="gone")
    samples = [s for m in metrics.registry.collect() for s in m.samples]
    assert not [s for s in samples if s.labels.get("adapter") == "gone"]
    assert len({s.labels["reason"] for s in samples if s.name == "moelora_adapter_failures_total"}) == 2
    assert metrics.registry.get_sample_value("moelora_adapter_downloaded_bytes_total", {"adapter": "kept"}) == 100


# --- the reference's table is the contract -----------------------------------------------------------------------


def recorded() -> Metrics:
    """Every metric with a sample: a labelled metric without one exposes no label names."""
    metrics = Metrics()
    metrics.loaded.labels(adapter="a", served_name="team/a").set(1)
    metrics.on_demand.labels(adapter="a").set(1)
    metrics.failures.labels(adapter="a", reason="RankTooHigh").inc()
    metrics.downloaded.labels(adapter="a").inc(100)
    metrics.load_seconds.observe(2.5)
    metrics.cache_bytes.set(100)
    metrics.ready.set(1)
    metrics.foreign.labels(action="unloaded").inc()
    return metrics


def exposed(metrics: Metrics) -> list[Any]:
    server = StatusServer(port=0, host="127.0.0.1", metrics=metrics, ready=lambda: True, alive=lambda: True)
    server.start()
    try:
        status, _, body = fetch(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    assert status == 200
    return list(text_string_to_metric_families(body))


def test_exposition_matches_the_readme_table_both_ways() -> None:
    assert exposed_metrics(exposed(recorded())) == readme_metrics("The adapter agent")


def test_no_created_series() -> None:
    samples = [sample.name for family in exposed(recorded()) for sample in family.samples]
    assert samples and not [name for name in samples if name.endswith("_created")]


def test_series_per_pod_are_bounded_as_the_reference_says() -> None:
    """Adapters add only per-adapter gauges and counters; the rest is a fixed count, stated in docs/reference.md."""
    metrics = recorded()
    for index in range(50):
        metrics.loaded.labels(adapter=f"x{index}", served_name=f"x{index}").set(1)
        metrics.downloaded.labels(adapter=f"x{index}").inc(1)
        metrics.load_seconds.observe(index)
    samples = [sample for family in exposed(metrics) for sample in family.samples]
    per_adapter = [sample for sample in samples if "adapter" in sample.labels]
    # the two series of each adapter, "a"'s one failure reason, and "a" held on demand
    assert len(per_adapter) == 2 * 51 + 1 + 1
    fixed = len(samples) - len(per_adapter)
    stated = re.search(r"and (\d+) more whatever the number of adapters", REFERENCE.read_text())
    foreign = len([sample for sample in samples if sample.name == "moelora_foreign_adapters_total"])
    assert stated and int(stated.group(1)) == fixed - foreign
