from __future__ import annotations

import datetime
from typing import Any

from moelora.api import AdapterCounts, LoRAAdapterStatus, ModelServerStatus
from moelora.operator.decide import status as st
from moelora.operator.errors import SpecProblem

from .conftest import make_spec

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=1)


def deployment(
    *,
    generation: int = 1,
    observed: int = 1,
    replicas: int = 2,
    updated: int = 2,
    ready: int = 2,
    available: int = 2,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "conditions": conditions or [],
        },
    }


def ms_status(
    dep: dict[str, Any] | None,
    *,
    problem: SpecProblem | None = None,
    replicas: int = 2,
    previous: ModelServerStatus | None = None,
    now: datetime.datetime = T0,
) -> ModelServerStatus:
    return st.model_server_status(
        make_spec(replicas=replicas),
        name="srv",
        namespace="ns",
        generation=3,
        deployment=dep,
        problem=problem,
        adapters=AdapterCounts(desired=2, loaded=1),
        previous=previous or ModelServerStatus(),
        now=now,
    )


def reasons(status: ModelServerStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_rolled_out_and_ready() -> None:
    status = ms_status(deployment())
    assert reasons(status) == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "RolledOut"),
        "Degraded": ("False", "AsExpected"),
    }
    assert (status.observed_generation, status.replicas, status.ready_replicas) == (3, 2, 2)
    assert status.endpoint == "http://srv.ns.svc:8000/v1" and status.selector == "moelora.io/model-server=srv"
    assert status.adapters.desired == 2 and all(c.observed_generation == 3 for c in status.conditions)


def test_no_deployment_yet() -> None:
    assert reasons(ms_status(None)) == {
        "Ready": ("False", "DeploymentNotFound"),
        "Progressing": ("True", "Creating"),
        "Degraded": ("False", "AsExpected"),
    }


def test_rolling_out_with_some_ready() -> None:
    status = ms_status(deployment(generation=2, observed=2, replicas=3, updated=1, ready=1, available=1))
    assert reasons(status) == {
        "Ready": ("True", "SomeReplicasReady"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "AsExpected"),
    }


def test_deployment_not_yet_observed_is_progressing() -> None:
    assert reasons(ms_status(deployment(generation=5, observed=4)))["Progressing"] == ("True", "RollingOut")


def test_nothing_ready() -> None:
    assert reasons(ms_status(deployment(ready=0, available=0)))["Ready"] == ("False", "NoReplicasReady")


def test_scaled_to_zero() -> None:
    dep = deployment(replicas=0, updated=0, ready=0, available=0)
    assert reasons(ms_status(dep, replicas=0))["Ready"] == ("False", "ScaledToZero")


def test_deadline_and_replica_failure_are_degraded() -> None:
    stuck = deployment(
        ready=0,
        available=0,
        conditions=[
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}
        ],
    )
    assert reasons(ms_status(stuck))["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert reasons(ms_status(stuck))["Progressing"] == ("False", "ProgressDeadlineExceeded")
    quota = deployment(
        ready=0,
        available=0,
        conditions=[{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota"}],
    )
    assert reasons(ms_status(quota))["Degraded"] == ("True", "FailedCreate")


def test_spec_problem_keeps_ready_from_the_running_deployment() -> None:
    problem = SpecProblem("UnknownEngineFlag", "engineArgs has --bogus")
    status = ms_status(deployment(), problem=problem)
    assert reasons(status) == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "UnknownEngineFlag"),
        "Degraded": ("True", "UnknownEngineFlag"),
    }
    fresh = ms_status(None, problem=problem)
    assert reasons(fresh)["Ready"] == ("False", "UnknownEngineFlag")
    assert "--bogus" in next(c.message for c in fresh.conditions if c.type == "Degraded")


def test_a_taken_name_shows_in_ready_and_withdraws_the_endpoint() -> None:
    taken = SpecProblem("NameTaken", "Service srv exists and is not owned by ModelServer srv")
    assert ms_status(deployment()).endpoint is not None
    serving = ms_status(deployment(), problem=taken)  # ours, created before the name was taken, still serves
    assert reasons(serving)["Ready"] == ("True", "NameTaken") and serving.endpoint is None
    fresh = ms_status(None, problem=taken)
    assert reasons(fresh) == {
        "Ready": ("False", "NameTaken"),
        "Progressing": ("False", "NameTaken"),
        "Degraded": ("True", "NameTaken"),
    }
    assert fresh.endpoint is None


def test_transition_time_kept_when_status_does_not_flip() -> None:
    first = ms_status(deployment())
    again = ms_status(deployment(), previous=first, now=T1)
    assert again == first  # nothing changed: the status is not rewritten
    flipped = ms_status(deployment(ready=0, available=0), previous=first, now=T1)
    times = {c.type: c.last_transition_time for c in flipped.conditions}
    assert times["Ready"] == T1 and times["Degraded"] == T0


def test_adapter_counts() -> None:
    assert st.adapter_counts(["Loaded", "Failed", "Pending", "Loaded"]) == AdapterCounts(desired=4, loaded=2, failed=1)


def adapter(replicas: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"replicas": replicas, **extra}


def patch(status: dict[str, Any], pods: dict[str, bool], *, exists: bool = True) -> dict[str, Any]:
    return st.adapter_status_patch(status, served_name="a", generation=1, server_exists=exists, pods=pods, now=T0)


def test_loaded_on_every_ready_pod() -> None:
    p = patch(
        adapter({"p1": {"loaded": True, "state": "Loaded"}, "p2": {"loaded": True, "state": "Loaded"}}),
        {"p1": True, "p2": True, "p3": False},
    )
    assert p["phase"] == "Loaded" and p["servedName"] == "a" and p["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in p["conditions"]} == {"Ready": "True", "Failed": "False"}


def test_a_refused_update_keeps_loaded_and_says_so() -> None:
    refused = {"lastError": "version v2 refused (RankTooHigh): rank 64 > 16", "reason": "UpdateRejected"}
    p = patch(
        adapter(
            {
                "p1": {"loaded": True, "state": "Loaded", "version": "v1", "rejectedVersion": "v2", **refused},
                "p2": {"loaded": True, "state": "Loaded", "version": "v1", "rejectedVersion": "v2", **refused},
            }
        ),
        {"p1": True, "p2": True},
    )
    ready = next(c for c in p["conditions"] if c["type"] == "Ready")
    assert p["phase"] == "Loaded" and (ready["status"], ready["reason"]) == ("True", "UpdateRejected")
    assert "p1 serves v1 and refused v2" in ready["message"] and "RankTooHigh" in ready["message"]


def test_a_new_pod_failing_where_others_serve_the_last_good_version_is_failed_and_says_who_serves_what() -> None:
    refused = {"lastError": "version v2 refused (RankTooHigh): rank 64 > 16", "reason": "UpdateRejected"}
    p = patch(
        adapter(
            {
                "p1": {"loaded": True, "state": "Loaded", "version": "v1", "rejectedVersion": "v2", **refused},
                "p2": {"loaded": False, "state": "Failed", "reason": "RankTooHigh", "lastError": "rank 64 > 16"},
            }
        ),
        {"p1": True, "p2": True},
    )
    failed = next(c for c in p["conditions"] if c["type"] == "Failed")
    assert p["phase"] == "Failed" and (p["loadedReplicas"], p["desiredReplicas"]) == (1, 2)
    assert failed["reason"] == "RankTooHigh"
    assert failed["message"] == "p2: rank 64 > 16; still loaded on 1 of 2 ready pod(s): p1 serves v1 (refused v2)"


def test_pending_with_a_retrying_replica_says_why() -> None:
    p = patch(
        adapter({"p1": {"state": "Pending", "reason": "EndpointUnreachable", "lastError": "listing: deadline passed"}}),
        {"p1": True},
    )
    ready = next(c for c in p["conditions"] if c["type"] == "Ready")
    assert p["phase"] == "Pending" and ready["reason"] == "EndpointUnreachable"
    assert ready["message"] == "p1: listing: deadline passed (retried)"


def test_loaded_on_some_ready_pods_is_downloading() -> None:
    p = patch(adapter({"p1": {"loaded": True, "state": "Loaded"}}), {"p1": True, "p2": True})
    assert p["phase"] == "Downloading"


def test_no_ready_pod_is_pending() -> None:
    p = patch(adapter({}), {"p1": False})
    assert p["phase"] == "Pending"
    assert next(c for c in p["conditions"] if c["type"] == "Ready")["reason"] == "Pending"


def test_a_permanent_failure_wins_with_the_replicas_reason() -> None:
    p = patch(
        adapter(
            {
                "p1": {"loaded": True, "state": "Loaded"},
                "p2": {"state": "Failed", "reason": "RankTooHigh", "lastError": "rank 64 > 16"},
            }
        ),
        {"p1": True, "p2": True},
    )
    assert p["phase"] == "Failed"
    failed = next(c for c in p["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "RankTooHigh") and "rank 64 > 16" in failed["message"]


def test_missing_server() -> None:
    p = patch(adapter({}), {}, exists=False)
    assert p["phase"] == "Failed"
    assert next(c for c in p["conditions"] if c["type"] == "Ready")["reason"] == "ModelServerNotFound"


def test_replicas_of_gone_pods_are_pruned_and_ignored() -> None:
    p = patch(
        adapter({"old": {"state": "Failed", "reason": "LoadFailed"}, "p1": {"loaded": True, "state": "Loaded"}}),
        {"p1": True},
    )
    assert p["replicas"] == {"old": None}
    assert p["phase"] == "Loaded"  # the gone pod's failure no longer counts


def test_nothing_to_write_when_unchanged() -> None:
    status = adapter({"p1": {"loaded": True, "state": "Loaded"}})
    first = patch(status, {"p1": True})
    applied = LoRAAdapterStatus.model_validate({**status, **first}).to_wire()
    assert patch(applied, {"p1": True}) == {}


def test_loaded_and_desired_count_the_ready_pods() -> None:
    p = patch(
        adapter({"p1": {"loaded": True, "state": "Loaded"}, "p3": {"loaded": True, "state": "Loaded"}}),
        {"p1": True, "p2": True, "p3": False},
    )
    assert (p["loadedReplicas"], p["desiredReplicas"]) == (1, 2)


def test_copies_placement_found_no_room_for_are_degraded_unless_something_worse_is() -> None:
    def short(problem: SpecProblem | None = None) -> ModelServerStatus:
        return st.model_server_status(
            make_spec(replicas=2),
            name="srv",
            namespace="ns",
            generation=3,
            deployment=deployment(),
            problem=problem,
            adapters=AdapterCounts(desired=9),
            previous=ModelServerStatus(),
            now=T0,
            placement_short=(2, 3),
        )

    status = short()
    assert reasons(status)["Degraded"] == ("True", "PlacementShort")
    assert reasons(status)["Ready"] == ("True", "AllReplicasReady")  # the adapters that fit are served
    assert next(c.message for c in status.conditions if c.type == "Degraded").startswith("3 copies of 2 adapter(s)")
    assert reasons(short(SpecProblem("UnknownEngineFlag", "x")))["Degraded"] == ("True", "UnknownEngineFlag")
    assert reasons(ms_status(deployment()))["Degraded"] == ("False", "AsExpected")
