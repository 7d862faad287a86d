"""The handlers' pure steps: what they render from an observation, without a cluster."""

from __future__ import annotations

import datetime

from moelora.operator.control import model_servers
from moelora.operator.decide import rollup
from moelora.operator.decide.indexes import AdapterEntry
from moelora.operator.errors import SpecProblem
from moelora.operator.render.children import Surroundings

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
META = {"name": "srv", "namespace": "ns", "generation": 3, "uid": "u"}


def conditions(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_refused_spec_still_gets_a_status_with_its_replica_count() -> None:
    observation = model_servers.Observation(
        body={"metadata": META, "spec": {"replicas": 2, "model": 7}},
        spec=None,
        problem=SpecProblem("InvalidSpec", "spec.model: not an object"),
        surroundings=Surroundings(),
    )
    status = model_servers.render_status(
        observation,
        deployment=None,
        problem=observation.problem,
        adapters=[AdapterEntry(name="a", phase="Loaded"), AdapterEntry(name="b", phase="Failed")],
        now=NOW,
    )
    assert conditions(status)["Degraded"] == ("True", "InvalidSpec")
    assert conditions(status)["Ready"] == ("False", "InvalidSpec")
    assert status["observedGeneration"] == 3
    assert status["adapters"] == {"desired": 2, "loaded": 1, "failed": 1}


def test_an_adapter_without_its_server_fails_and_an_unchanged_one_patches_nothing() -> None:
    body = {"metadata": {"name": "a", "namespace": "ns", "generation": 1}, "spec": {"modelServer": "srv"}}
    observation = rollup.Observation(body=body, server_exists=False, pods={})
    patch = rollup.render_status_patch(observation, now=NOW)
    assert patch["phase"] == "Failed" and patch["servedName"] == "a"
    stored = {**body, "status": patch}
    unchanged = rollup.Observation(body=stored, server_exists=False, pods={})
    assert rollup.render_status_patch(unchanged, now=NOW) == {}
