"""Per-adapter metrics and the status server's three endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request

from moelora.agent.metrics import Metrics, StatusServer


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
        metrics.load_seconds.labels(name).observe(0.5)
        metrics.downloaded.labels(name).inc(100)
        metrics.failures.labels(name, "SourceNotFound").inc()
        metrics.failures.labels(name, "RankTooHigh").inc()
    metrics.forget(adapter="gone", served_name="gone")
    samples = [s for m in metrics.registry.collect() for s in m.samples]
    assert not [s for s in samples if s.labels.get("adapter") == "gone"]
    assert len({s.labels["reason"] for s in samples if s.name == "moelora_adapter_failures_total"}) == 2
    assert metrics.registry.get_sample_value("moelora_adapter_downloaded_bytes_total", {"adapter": "kept"}) == 100
