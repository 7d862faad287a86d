"""The agent's Prometheus metrics, and the small HTTP server for /metrics, /readyz and /healthz.

Cardinality: a pod serves thousands of adapters and a cluster runs many pods, so only a few series are per adapter
(one loaded gauge, one downloaded-bytes counter, a failure counter per reason that occurred), all dropped when the
adapter is deleted; everything else, the load-duration histogram included, is one series set per pod. The README's
metrics table lists exactly what /metrics exposes (tests/agent/test_metrics.py compares them).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# apply -> loaded spans listing, download, validation and vLLM's load: seconds for small adapters, minutes for large.
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600)


class Metrics:
    """One registry per agent, so several agents (tests, the embedded stack) never share series."""

    def __init__(self) -> None:
        # A `_created` series per counter and histogram doubles the scrape for nothing a dashboard reads; the switch
        # is process-wide, and the agent's process has no other registry.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.loaded = Gauge(
            "moelora_adapter_loaded",
            "1 while vLLM serves the adapter on this pod.",
            ["adapter", "served_name"],
            registry=self.registry,
        )
        self.load_seconds = Histogram(
            "moelora_adapter_load_duration_seconds",
            "From starting work on an adapter version to vLLM serving it, over all adapters of this pod.",
            buckets=LOAD_BUCKETS,
            registry=self.registry,
        )
        self.downloaded = Counter(
            "moelora_adapter_downloaded_bytes_total",
            "Bytes downloaded from S3 for the adapter.",
            ["adapter"],
            registry=self.registry,
        )
        self.failures = Counter(
            "moelora_adapter_failures_total",
            "Failed attempts, by reason.",
            ["adapter", "reason"],
            registry=self.registry,
        )
        # No adapter label: the names are chosen by whoever bypassed the agent, and must not grow the scrape.
        self.foreign = Counter(
            "moelora_foreign_adapters_total",
            "Adapters vLLM served that this agent did not load: unloaded, or replaced in place and put back.",
            ["action"],
            registry=self.registry,
        )
        self.on_demand = Gauge(
            "moelora_adapter_on_demand",
            "1 while this pod holds the adapter because a request asked for it here, not because it is placed here.",
            ["adapter"],
            registry=self.registry,
        )
        self.cache_bytes = Gauge("moelora_adapter_cache_bytes", "Bytes in the adapter cache.", registry=self.registry)
        self.ready = Gauge(
            "moelora_agent_ready",
            "1 when vLLM is up and every adapter is settled, or MOELORA_READY_WAIT_SECONDS passed since vLLM came up.",
            registry=self.registry,
        )
        self.pending = Gauge(
            "moelora_agent_pending_adapters",
            "Desired adapters neither loaded nor failed for good on this pod.",
            registry=self.registry,
        )
        self.cache_reserved = Gauge(
            "moelora_agent_cache_reserved_bytes",
            "Bytes of the adapter cache reserved by downloads in flight.",
            registry=self.registry,
        )

    def forget_on_demand(self, adapter: str) -> None:
        try:
            self.on_demand.remove(adapter)
        except KeyError:
            pass

    def forget(self, *, adapter: str, served_name: str) -> None:
        """Drop a deleted adapter's series (500 adapters coming and going must not grow the scrape forever)."""
        self.forget_on_demand(adapter)
        for metric, labels in ((self.loaded, (adapter, served_name)), (self.downloaded, (adapter,))):
            try:
                metric.remove(*labels)
            except KeyError:
                pass
        reasons = {
            s.labels["reason"]
            for m in self.failures.collect()
            for s in m.samples
            if s.labels.get("adapter") == adapter and s.name.endswith("_total")
        }
        for reason in reasons:
            try:
                self.failures.remove(adapter, reason)
            except KeyError:
                pass


class StatusServer:
    """/metrics, /readyz (200 only when `ready()`), /healthz (200 while `alive()`), on its own thread."""

    def __init__(
        self,
        *,
        port: int,
        metrics: Metrics,
        ready: Callable[[], bool],
        alive: Callable[[], bool],
        host: str = "0.0.0.0",
    ) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(outer.metrics.registry), CONTENT_TYPE_LATEST)
                elif path == "/readyz":
                    ok = outer.ready()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"not ready\n")
                elif path == "/healthz":
                    ok = outer.alive()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"stuck\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: not worth a line
                pass

        self.metrics = metrics
        self.ready = ready
        self.alive = alive
        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="status-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
