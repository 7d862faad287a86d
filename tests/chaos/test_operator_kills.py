"""Issue 17's crash chaos for the operator (benchmarks/chaos_operator.py): SIGKILLs of `python -m moelora.operator`
while adapters and servers are created, changed and deleted; after the last restart each server owns exactly the
children its spec asks for, nothing the operator labels is left without an owner, counts and phases are right
within 10 s, and no finalizer holds anything; it stays so until the checks end (30 s after the restart at full
size). The full size (100 kills) is `make chaos`'s; the default run kills it 10 times. The checker itself is
tested first, on snapshots made by hand, so a pass cannot come from a check that sees nothing."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))

from chaos_cluster import Item, Snapshot, violations  # noqa: E402
from chaos_operator import run, table  # noqa: E402

POD = "s0-abcde-0"


def _item(kind: str, name: str, uid: str, **fields: Any) -> Item:
    meta = {"name": name, "namespace": "chaos", "uid": uid, "generation": 1, **fields.pop("metadata", {})}
    return Item(path=f"/x/{kind}/{name}", raw={"kind": kind, "metadata": meta, **fields})


def _owner(uid: str) -> dict[str, Any]:
    return {
        "ownerReferences": [{"uid": uid, "controller": True}],
        "labels": {"app.kubernetes.io/managed-by": "moelora"},
    }


def consistent() -> list[Item]:
    """One server with one replica and one loaded adapter, as the operator and the cluster leave them."""
    ready = [{"type": "Ready", "status": "True", "reason": "Loaded"}]
    server_status = {
        "observedGeneration": 1,
        "adapters": {"desired": 1, "loaded": 1, "failed": 0},
        "readyReplicas": 1,
        "conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected"}],
    }
    adapter_status = {
        "phase": "Loaded",
        "conditions": ready,
        "loadedReplicas": 1,
        "desiredReplicas": 1,
        "rollup": "Current",
        "observedGeneration": 1,
        "replicas": {POD: {"loaded": True}},
    }
    pod_meta = {**_owner("d0"), "labels": {"moelora.io/model-server": "s0"}}
    return [
        _item("ModelServer", "s0", "u0", spec={"replicas": 1}, status=server_status),
        _item("Deployment", "s0", "d0", metadata=_owner("u0"), spec={"replicas": 1}),
        _item("Service", "s0", "v0", metadata=_owner("u0")),
        _item("Pod", POD, "p0", metadata=pod_meta, status={"conditions": ready}),
        _item(
            "LoRAAdapter",
            "a00",
            "l0",
            spec={"modelServer": "s0", "source": {"uri": "s3://b/good/a00/"}},
            status=adapter_status,
        ),  # fmt: skip
    ]


def test_the_checker_passes_a_consistent_state() -> None:
    assert violations(Snapshot(consistent())) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda items: items.append(_item("PodDisruptionBudget", "s0", "b0", metadata=_owner("u0"))),
         "owns PodDisruptionBudget ['s0'], expected []"),
        (lambda items: items.append(_item("Deployment", "s0-old", "d1", metadata=_owner("u0"), spec={"replicas": 1})),
         "owns Deployment ['s0', 's0-old']"),
        (lambda items: items.pop(2), "owns Service [], expected ['s0']"),
        (lambda items: items.append(_item("ConfigMap", "x", "c0", metadata={"labels": _owner("u0")["labels"]})),
         "ConfigMap x carries the managed-by label and has no owner"),
        (lambda items: items[0].raw["status"]["adapters"].update(loaded=0), "ModelServer s0 counts"),
        (lambda items: items[0].raw["metadata"].update(generation=2), "observedGeneration 1 != 2"),
        (lambda items: items[4].raw["status"].update(rollup="Stale"), "rollup 'Stale', expected 'Current'"),
        (lambda items: items[4].raw["spec"].update(modelServer="s1"), "expected 'ModelServerNotFound'"),
        (lambda items: items[1].raw["metadata"].update(deletionTimestamp="t", finalizers=["f"]),
         "Deployment s0 deleting, held by finalizers ['f']"),
    ],
)  # fmt: skip
def test_the_checker_sees_what_is_wrong(change: Any, expected: str) -> None:
    items = consistent()
    change(items)
    found = violations(Snapshot(items))
    assert any(expected in violation for violation in found), found


def _assert_recovered(report: Any, *, within_s: float) -> None:
    print(table(report))
    assert report.violations == [], table(report)
    assert report.consistent_s is not None and report.consistent_s <= within_s, table(report)
    assert report.finalizers_seen == 0
    assert report.violations_at_restart > 0  # the last start had something to put right
    assert sum(report.operations.values()) >= 3 * report.kills  # the objects really changed around the kills


@pytest.mark.slow
def test_ten_kills_during_changes() -> None:
    report = run(kills=10, seed=1, up_s=(0.2, 2.0), settle_s=15)
    _assert_recovered(report, within_s=10)


@pytest.mark.chaos
def test_hundred_kills_during_changes() -> None:
    report = run(kills=100, seed=17, up_s=(0.2, 3.0), settle_s=30)
    _assert_recovered(report, within_s=10)
