"""Each adapter's load on a pod, from vLLM's vllm:lora_requests_info gauge: parsing the series vLLM writes, and the
estimate of requests in flight that placement's copiesMode Auto reads."""

from __future__ import annotations

import math

import prometheus_client
import pytest

from moelora.agent.reconcile import Record, Stage
from moelora.agent.report.usage import LoadSampler, in_flight


def vllm_metrics(states: list[tuple[str, str]]) -> str:
    """/metrics as vLLM 0.32 writes the gauge (v1/metrics/loggers.py): one series per (waiting, running) set, set to
    the current time at each engine step; later states in `states` are the newer ones."""
    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        labelnames=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        registry=registry,
    )
    other = prometheus_client.Counter("vllm:request_success", "x", labelnames=["model_name"], registry=registry)
    other.labels(model_name="base").inc()
    for at, (waiting, running) in enumerate(states):
        gauge.labels(max_lora="4", waiting_lora_adapters=waiting, running_lora_adapters=running).set(1000.0 + at)
    return prometheus_client.generate_latest(registry).decode()


def test_the_latest_series_is_what_is_in_flight_now() -> None:
    assert in_flight(vllm_metrics([("", "a,b"), ("c", "a")])) == {"a", "c"}
    assert in_flight(vllm_metrics([("c", "a"), ("", "")])) == set()  # the last step finished everything
    assert in_flight(vllm_metrics([])) is None  # no LoRA request yet: no series
    assert in_flight("vllm:num_requests_running 0\n") is None


def always(sampler: LoadSampler, busy: set[str], names: set[str], start: float, seconds: int) -> float:
    for step in range(seconds + 1):
        sampler.sample(busy, names=names, now=start + step)
    return start + seconds


def test_always_in_flight_reads_as_time_over_window_until_the_cap() -> None:
    # Busy at every sample for t seconds: b = 1 - exp(-t / window), so -ln(1 - b) = t / window.
    sampler = LoadSampler(window_seconds=10)
    always(sampler, {"a"}, {"a", "idle"}, start=0, seconds=30)
    assert -math.log(1 - sampler.busy["a"]) == pytest.approx(3.0)
    assert 3.0 / 1.5 < sampler.load("a") <= 3.0  # reported in steps of half again
    assert sampler.load("idle") == 0.0
    always(sampler, {"a"}, {"a"}, start=31, seconds=100)
    assert -math.log(0.01) / 1.5 < sampler.load("a") <= round(-math.log(0.01), 2)  # capped at b = 0.99


def test_in_flight_half_the_time_is_ln_2_requests_and_idle_decays_to_none() -> None:
    sampler = LoadSampler(window_seconds=50)
    for step in range(400):
        sampler.sample({"a"} if step % 2 else set(), names={"a"}, now=step)
    assert math.log(2) / 1.5 <= sampler.load("a") <= math.log(2) * 1.5
    always(sampler, set(), {"a"}, start=400, seconds=400)
    assert sampler.load("a") == 0.0
    sampler.sample(set(), names=set(), now=801)  # unloaded: forgotten
    assert sampler.load("a") is None


def test_reports_change_rarely() -> None:
    sampler = LoadSampler(window_seconds=30)
    seen = []
    for step in range(300):
        sampler.sample({"a"} if step % 3 else set(), names={"a"}, now=step)
        seen.append(sampler.load("a"))
    changes = sum(1 for before, after in zip(seen, seen[1:], strict=False) if before != after)
    assert changes <= 10, seen


def test_update_sets_the_loaded_records_load_from_vllm() -> None:
    records = [Record(uid="1", name="a", served_name="a", spec_hash="h", stage=Stage.LOADED)]
    records.append(Record(uid="2", name="b", served_name="b", spec_hash="h"))  # not loaded: no load
    sampler = LoadSampler(window_seconds=5)
    for step in range(20):
        sampler.update(fetch=lambda: vllm_metrics([("", "b"), ("", "a")]), records=records, now=step)
    assert records[0].load is not None and records[0].load > 1.0
    assert records[1].load is None
    assert records[0].state().load == records[0].load
    sampler.update(fetch=lambda: None, records=records, now=30)  # vLLM away: no sample, the last report stays
    assert records[0].load is not None and records[0].load > 1.0
