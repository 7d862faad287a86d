"""The roll-up and its Events say what the agents report: a refused version is a Warning, a retry keeps the reason
of the attempt before it, and a re-check that leaves the adapter loaded says nothing."""

from __future__ import annotations

import datetime
from typing import Any

from moelora.operator.decide import status as st
from moelora.operator.decide.rollup import Emission, adapter_transition

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
LOADED_AT = "2030-01-01T00:00:00Z"


def rollup(stored: dict[str, Any], replicas: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], Emission | None]:
    """The roll-up's patch over `stored` once the agents wrote `replicas`, and the Event of that write."""
    status = {**stored, "replicas": replicas}
    patch = st.adapter_status_patch(
        status, served_name="a", generation=1, server_exists=True, pods=dict.fromkeys(replicas, True), now=T0
    )
    return {**status, **patch}, adapter_transition(status, patch)


def loaded(**extra: Any) -> dict[str, Any]:
    return {"loaded": True, "state": "Loaded", "version": "v1", "loadedAt": LOADED_AT, **extra}


def test_a_refused_version_is_a_warning_with_its_reason_once() -> None:
    stored, event = rollup({}, {"p1": loaded()})
    assert event == Emission("Normal", "Loaded", "loaded on 1/1 replicas")
    refused = {"rejectedVersion": "v2", "reason": "UpdateRejected", "lastError": "version v2 refused (RankTooHigh): r"}
    stored, event = rollup(stored, {"p1": loaded(**refused)})
    assert event is not None and (event.type, event.reason) == ("Warning", "UpdateRejected")
    assert "p1 serves v1 and refused v2" in event.message and "RankTooHigh" in event.message
    _, again = rollup(stored, {"p1": loaded(**refused)})
    assert again is None  # the same refusal: nothing new
    _, scaled = rollup(stored, {"p1": loaded(**refused), "p2": loaded(**refused)})
    assert scaled is None  # nor on one pod more
    worse = {**refused, "rejectedVersion": "v3", "lastError": "version v3 refused (OutputNonFinite): nan"}
    _, event = rollup(stored, {"p1": loaded(**worse)})
    assert event is not None and event.reason == "UpdateRejected" and "OutputNonFinite" in event.message


def test_a_recheck_that_keeps_it_loaded_says_nothing() -> None:
    stored, _ = rollup({}, {"p1": loaded()})
    stored, event = rollup(stored, {"p1": loaded()})
    assert event is None and stored["phase"] == "Loaded"


def test_a_retry_under_way_keeps_the_reason_of_the_attempt_before() -> None:
    why = {"reason": "EndpointUnreachable", "lastError": "listing: deadline passed"}
    stored, _ = rollup({}, {"p1": {"state": "Pending", **why}})
    stored, event = rollup(stored, {"p1": {"state": "Downloading", **why}})
    ready = next(c for c in stored["conditions"] if c["type"] == "Ready")
    assert stored["phase"] == "Downloading" and ready["reason"] == "EndpointUnreachable"
    assert ready["message"] == "loaded on 0 of 1 ready pod(s); p1: listing: deadline passed (retried)"
    assert event is None
    stored, _ = rollup(stored, {"p1": {"state": "Downloading"}})  # a first attempt has no reason to show
    assert next(c for c in stored["conditions"] if c["type"] == "Ready")["reason"] == "Downloading"
