"""The operator's Prometheus metrics and their /metrics server (settings.metrics_port).

Cardinality is bounded by the code, not by the cluster: no label names an object; `resource` and `kind` are the
kinds the operator handles or owns, `result` one of three words, `reason` a SpecProblem reason or an exception's
class name, `phase` one of the four adapter phases. The gauges of objects managed are read from kopf's indexes in
the event loop every REFRESH_SECONDS (the indexes are not thread-safe, the HTTP server runs on its own thread).
The operator metrics table of docs/reference.md lists exactly what /metrics exposes (tests/operator/test_metrics.py).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from moelora.api import AdapterPhase
from moelora.operator.errors import SpecProblem

if TYPE_CHECKING:
    from moelora.operator.control.context import Context

_P = ParamSpec("_P")
_T = TypeVar("_T")

# A reconcile is a handful of API round trips: milliseconds when nothing changed, seconds against a slow API server.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
REFRESH_SECONDS = 5.0  # how stale the object gauges may be; a scrape every 30 s never sees the difference


class Metrics:
    """One registry per operator, so several operators in one process (tests, the local stack) never share series."""

    def __init__(self) -> None:
        # `_created` series double the scrape for nothing a dashboard reads; the operator's process has no other
        # registry that would want them.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "moelora_operator_reconciles",
            "Reconciles, by resource and result (success, problem: a spec the operator refuses, error: an exception).",
            ["resource", "result"],
            registry=self.registry,
        )
        self.errors = Counter(
            "moelora_operator_errors",
            "Reconciles that ended in a problem or an exception, by its reason or the exception's class.",
            ["reason"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "moelora_operator_reconcile_duration_seconds",
            "How long one reconcile took, API calls included, by resource.",
            ["resource"],
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.model_servers = Gauge(
            "moelora_operator_model_servers", "ModelServers the operator watches.", registry=self.registry
        )
        self.adapters = Gauge(
            "moelora_operator_lora_adapters",
            "LoRAAdapters the operator watches, by phase.",
            ["phase"],
            registry=self.registry,
        )
        self.children = Gauge(
            "moelora_operator_children",
            "Objects the operator owns for its ModelServers, by kind.",
            ["kind"],
            registry=self.registry,
        )
        for phase in AdapterPhase:
            self.adapters.labels(phase=phase.value).set(0)
        self._children: dict[tuple[str, str], list[str]] = {}
        self._lock = threading.Lock()  # reconciles report their children from the executor's threads
        self.server: Any = None

    def observe_reconcile(self, resource: str, seconds: float, *, result: str, reason: str | None = None) -> None:
        self.reconciles.labels(resource=resource, result=result).inc()
        self.duration.labels(resource=resource).observe(seconds)
        if reason is not None:
            self.errors.labels(reason=reason).inc()

    def set_children(self, server: tuple[str, str], kinds: Iterable[str] | None) -> None:
        """The kinds of the children one server owns after its reconcile; None when the server is gone."""
        with self._lock:
            if kinds is None:
                self._children.pop(server, None)
            else:
                self._children[server] = list(kinds)
            totals: dict[str, int] = {}
            for owned in self._children.values():
                for kind in owned:
                    totals[kind] = totals.get(kind, 0) + 1
            for kind in {s.labels["kind"] for m in self.children.collect() for s in m.samples} - set(totals):
                totals[kind] = 0  # a kind no server owns any more reads 0, not its last count
            for kind, count in totals.items():
                self.children.labels(kind=kind).set(count)

    def set_objects(self, *, model_servers: int, adapter_phases: Iterable[str]) -> None:
        self.model_servers.set(model_servers)
        counts = {phase.value: 0 for phase in AdapterPhase}
        for phase in adapter_phases:
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in counts.items():
            self.adapters.labels(phase=phase).set(count)


def timed(resource: str) -> Callable[[Callable[_P, _T]], Callable[_P, _T]]:
    """Count and time a reconcile function taking `memo=`: a SpecProblem it returns counts as a problem, an
    exception it raises as an error (and is raised on)."""

    def decorate(fn: Callable[_P, _T]) -> Callable[_P, _T]:
        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            metrics: Metrics = kwargs["memo"].metrics  # type: ignore[attr-defined]  # every reconcile takes memo=
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                metrics.observe_reconcile(
                    resource, time.perf_counter() - start, result="error", reason=type(exc).__name__
                )
                raise
            if isinstance(result, SpecProblem):
                metrics.observe_reconcile(resource, time.perf_counter() - start, result="problem", reason=result.reason)
            else:
                metrics.observe_reconcile(resource, time.perf_counter() - start, result="success")
            return result

        return wrapper

    return decorate


async def refresh_forever(*, metrics: Metrics, model_servers_index: Any, adapters_index: Any) -> None:
    while True:
        metrics.set_objects(
            model_servers=len(model_servers_index),
            adapter_phases=[entry.phase for key in list(adapters_index) for entry in adapters_index.get(key, [])],
        )
        await asyncio.sleep(REFRESH_SECONDS)


async def start(memo: Context, model_servers_index: Any, adapters_index: Any, **_: Any) -> None:
    """kopf startup activity: serve /metrics (when a port is set) and keep the object gauges fresh."""
    metrics: Metrics = memo.metrics
    port = memo.settings.metrics_port
    if port is not None:
        metrics.server, _thread = start_http_server(port, addr=memo.settings.metrics_host, registry=metrics.registry)
    task = asyncio.create_task(
        refresh_forever(metrics=metrics, model_servers_index=model_servers_index, adapters_index=adapters_index),
        name="moelora-metrics",
    )
    memo.background.append(task)


async def stop(memo: Context, **_: Any) -> None:
    """kopf cleanup activity: stop serving /metrics (the refresh task goes with resync's cleanup of the others)."""
    metrics: Metrics = memo.metrics
    if metrics.server is not None:
        metrics.server.shutdown()
        metrics.server.server_close()
        metrics.server = None
