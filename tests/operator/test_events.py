"""Which roll-up writes become Events, and the correlator's folding of identical Events (no API server: apply's two
Event calls are stood in for)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from moelora.operator.decide.rollup import Emission, adapter_transition
from moelora.operator.kube import apply, events
from moelora.operator.kube.events import Recorder

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
INVOLVED = {"apiVersion": "moelora.io/v1alpha1", "kind": "LoRAAdapter", "namespace": "n", "name": "a", "uid": "u1"}


def failed(reason: str, message: str = "pod: boom") -> dict[str, Any]:
    return {
        "phase": "Failed",
        "conditions": [
            {"type": "Ready", "status": "False", "reason": reason, "message": message},
            {"type": "Failed", "status": "True", "reason": reason, "message": message},
        ],
    }


def test_transitions_of_the_rollup() -> None:
    loaded = {"phase": "Loaded", "loadedReplicas": 3, "desiredReplicas": 3}
    assert adapter_transition({"phase": "Downloading"}, loaded) == Emission(
        "Normal", "Loaded", "loaded on 3/3 replicas"
    )
    assert adapter_transition({}, failed("RankTooHigh")) == Emission("Warning", "RankTooHigh", "pod: boom")
    assert adapter_transition(failed("RankTooHigh"), failed("AccessDenied")).reason == "AccessDenied"
    # Still failing for the same reason (another pod's message, a count): nothing new to say.
    assert adapter_transition(failed("RankTooHigh"), failed("RankTooHigh", "other: boom")) is None
    unloaded = {"phase": "Downloading", "conditions": [{"type": "Ready", "message": "loaded on 2 of 3 ready pod(s)"}]}
    assert adapter_transition(loaded, unloaded) == Emission(
        "Normal", "Unloaded", "no longer loaded on every ready replica (Downloading: loaded on 2 of 3 ready pod(s))"
    )
    assert adapter_transition({"phase": "Pending"}, {"phase": "Downloading"}) is None
    assert adapter_transition(loaded, {"desiredReplicas": 4}) is None


class FakeEvents:
    """apply.create_event / patch_event over a dict, with the Event's TTL expiry on demand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        monkeypatch.setattr(apply, "create_event", self.create)
        monkeypatch.setattr(apply, "patch_event", self.patch)

    def create(self, *, api: Any, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        name = f"{event['metadata']['generateName']}{len(self.stored)}"
        self.stored[name] = {**event, "metadata": {**event["metadata"], "name": name}}
        return self.stored[name]

    def patch(self, *, api: Any, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if name not in self.stored:
            raise ApiException(status=404)
        self.stored[name].update(patch)
        return self.stored[name]


def test_identical_events_within_the_window_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, recorder = FakeEvents(monkeypatch), Recorder(window=datetime.timedelta(minutes=10))
    warning = Emission("Warning", "AccessDenied", "pod: denied")
    for minute in (0, 1, 5):
        recorder.record(api=None, involved=INVOLVED, emission=warning, now=T0 + datetime.timedelta(minutes=minute))
    (only,) = fake.stored.values()
    assert (only["count"], only["firstTimestamp"], only["lastTimestamp"]) == (
        3,
        "2030-01-01T00:00:00Z",
        "2030-01-01T00:05:00Z",
    )
    # Another message, another reason, another object (a recreated adapter's new uid): Events of their own.
    recorder.record(api=None, involved=INVOLVED, emission=Emission("Warning", "AccessDenied", "x"), now=T0)
    recorder.record(api=None, involved={**INVOLVED, "uid": "u2"}, emission=warning, now=T0)
    assert len(fake.stored) == 3


def test_past_the_window_or_once_expired_a_new_event(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, recorder = FakeEvents(monkeypatch), Recorder(window=datetime.timedelta(minutes=10))
    warning = Emission("Warning", "RankTooHigh", "pod: rank 64 > 16")
    recorder.record(api=None, involved=INVOLVED, emission=warning, now=T0)
    recorder.record(api=None, involved=INVOLVED, emission=warning, now=T0 + datetime.timedelta(minutes=11))
    assert [e["count"] for e in fake.stored.values()] == [1, 1]
    fake.stored.clear()  # the API server's TTL
    recorder.record(api=None, involved=INVOLVED, emission=warning, now=T0 + datetime.timedelta(minutes=12))
    assert [e["count"] for e in fake.stored.values()] == [1]


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, recorder = FakeEvents(monkeypatch), Recorder(size=2)
    for index in range(3):
        recorder.record(api=None, involved=INVOLVED, emission=Emission("Normal", "Loaded", str(index)), now=T0)
    recorder.record(api=None, involved=INVOLVED, emission=Emission("Normal", "Loaded", "0"), now=T0)
    assert len(fake.stored) == 4  # "0" was forgotten, so it is created again
    assert events.new_event(INVOLVED, Emission("Normal", "R", "m" * 5000), now=T0)["message"] == "m" * 1024
