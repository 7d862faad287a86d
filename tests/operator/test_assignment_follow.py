"""copiesMode Auto's homes follow the load: the operator's assignment reads each adapter's load per pod (assigned
and on demand) and moves a copy to where the router sends it, make-before-break, without adding scale-event moves."""

from __future__ import annotations

import dataclasses
import datetime
import random
from typing import Any

from moelora.api import AdapterPlacement
from moelora.operator.decide import placement, plan
from moelora.operator.decide.assignment import AdapterState, Server, assign, pod_names
from moelora.operator.decide.expectations import ServerWrites
from moelora.operator.decide.indexes import AdapterEntry, ServerEntry, adapters_index, placement_index

NOW = 1_000_000.0


def auto(replicas: int = 4, *, drain: float = 30.0, following: bool = True) -> Server:
    return Server(name="ms", replicas=replicas, copies=1, disk_bytes=None, drain_seconds=drain, auto=following)


def settled(name: str, pods: list[str], load: dict[str, float], at: float = NOW - 100) -> AdapterState:
    """An adapter assigned `pods`, loaded there since `at`, with `load` per pod."""
    current = AdapterPlacement(replicas=pods, target=pods, draining=[], copies=len(pods))
    return AdapterState(
        name=name, current=current, loaded_on=dict.fromkeys(pods, at), load=sum(load.values()), pod_load=load
    )


def fleet(a_load: dict[str, float]) -> list[AdapterState]:
    """`a` on ms-0 and seven others as busy, one or two on each pod (every pod holds something, so placement keeps
    homes): each has 1/8 of the load and one copy (ceil(1/8 x 4 pods x 1 slot))."""
    busy = max(sum(a_load.values()), 1.0)
    others = [settled(name, [f"ms-{i % 4}"], {f"ms-{i % 4}": busy}) for i, name in enumerate("bcdefgh", start=1)]
    return [settled("a", ["ms-0"], a_load), *others]


def test_the_index_reads_each_pods_load_assigned_or_on_demand() -> None:
    status = {
        "placement": {"replicas": ["ms-0"], "target": ["ms-0"]},
        "replicas": {"ms-0": {"loaded": True, "load": 0.5}},
        "onDemandLoad": {"ms-1": 1.0, "ms-0": 9.0},  # ms-0's entry wins: the pod counts once
    }
    spec = {"modelServer": "ms"}
    body = {"metadata": {"name": "a", "namespace": "ns"}, "spec": spec, "status": status}
    placed = adapters_index(body=body, spec=spec, status=status, name="a", namespace="ns")[("ns", "ms")].placed
    assert placed is not None and (dict(placed.pod_load), placed.load) == ({"ms-0": 0.5, "ms-1": 1.0}, 1.5)


def test_a_home_moves_to_the_pod_serving_its_adapter_on_demand_make_before_break() -> None:
    # ms-1 serves a on demand with twice the load of a's home, ms-0.
    adapters = fleet({"ms-0": 0.5, "ms-1": 1.0})
    result, _ = assign(auto(), adapters, now=NOW)
    a = result["a"]
    assert (a.copies, a.target, a.draining, a.replicas) == (1, ["ms-1"], ["ms-0"], ["ms-1", "ms-0"])
    assert all(result[s.name].target == list(s.assigned) for s in adapters[1:])  # the others stay
    # The old home serves until the new one reports loaded and drainSeconds have passed since.
    moving = AdapterState(name="a", current=a, loaded_on={"ms-0": NOW - 100, "ms-1": NOW}, pod_load={"ms-0": 9.0})
    adapters[0] = moving  # the old home busy again meanwhile: a move under way is not turned back
    assert assign(auto(), adapters, now=NOW + 10)[0]["a"].replicas == ["ms-1", "ms-0"]
    assert assign(auto(), adapters, now=NOW + 30)[0]["a"].replicas == ["ms-1"]


def test_a_current_home_stays_unless_another_pod_carries_half_again_its_load() -> None:
    assert assign(auto(), fleet({"ms-0": 1.0, "ms-1": 1.4}), now=NOW)[0]["a"].replicas == ["ms-0"]
    assert assign(auto(), fleet({"ms-0": 1.0, "ms-1": 1.6}), now=NOW)[0]["a"].target == ["ms-1"]
    assert assign(auto(), fleet({"ms-0": 0.0, "ms-3": 0.2}), now=NOW)[0]["a"].target == ["ms-3"]
    # Load reported by a pod scaled away never displaces a home that exists.
    assert assign(auto(), fleet({"ms-0": 0.1, "ms-7": 5.0}), now=NOW)[0]["a"].replicas == ["ms-0"]


def test_fixed_copies_keep_their_rendezvous_homes() -> None:
    assert assign(auto(following=False), fleet({"ms-0": 0.5, "ms-1": 1.0}), now=NOW)[0]["a"].replicas == ["ms-0"]


def test_more_copies_than_loaded_pods_keep_their_other_homes() -> None:
    # Two copies wanted (its own spec.replicas), load only on ms-2: ms-2 gains one, the busier current home stays.
    adapters = fleet({})
    adapters[0] = dataclasses.replace(settled("a", ["ms-0", "ms-3"], {"ms-2": 1.0, "ms-3": 0.3}), copies=2)
    a = assign(auto(), adapters, now=NOW)[0]["a"]
    assert (sorted(a.target), a.draining) == (["ms-2", "ms-3"], ["ms-0"])


def test_a_scale_out_moves_no_more_copies_than_placement_alone() -> None:
    # 300 adapters settled on 16 pods, each busy on its homes, some also served on demand elsewhere (under the margin).
    rng = random.Random(7)
    names = [f"adapter-{i}" for i in range(300)]
    first, _ = assign(auto(16), [AdapterState(name=n, load=rng.random()) for n in names], now=NOW)
    states = []
    for name in names:
        homes = first[name].target
        load = {pod: rng.uniform(0.5, 2.0) for pod in homes}
        if rng.random() < 0.3:
            load[rng.choice(pod_names("ms", 16))] = min(load.values()) * 1.4  # ties to a home pod are fine too
        states.append(settled(name, homes, load))
    before = {s.name: s.assigned for s in states}
    followed = assign(auto(17), states, now=NOW)[0]
    alone = assign(auto(17), [dataclasses.replace(s, pod_load={}) for s in states], now=NOW)[0]
    assert {n: p.target for n, p in followed.items()} == {n: p.target for n, p in alone.items()}
    moved = placement.moved(before, {n: p.target for n, p in followed.items()})
    assert 0 < moved <= 1.2 * sum(map(len, before.values())) / 17


def test_a_pass_moves_the_home_from_the_agents_status_fields() -> None:
    """The operator's pure pass (plan.plan) from the indexes' entries as the agents write them: `a` assigned ms-0
    (load 0.5 there) and served on demand by ms-1 (onDemandLoad 1.0) moves to ms-1, ms-0 serving until it loads."""
    spec = {"model": {"name": "m"}, "replicas": 2, "placement": {"copiesMode": "Auto"}, "lora": {"maxLoras": 1}}
    server = placement_index(spec=spec, name="ms", namespace="ns")[("ns", "ms")]
    loaded_at = "2026-12-04T00:00:00+00:00"

    def entry(name: str, status: dict[str, Any]) -> AdapterEntry:
        spec = {"modelServer": "ms"}
        body = {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": status}
        return adapters_index(body=body, spec=spec, status=status, name=name, namespace="ns")[("ns", "ms")]

    a = {
        "placement": {"replicas": ["ms-0"], "target": ["ms-0"], "copies": 1},
        "replicas": {"ms-0": {"loaded": True, "loadedAt": loaded_at, "load": 0.5}},
        "onDemandLoad": {"ms-1": 1.0},
    }
    b = {  # busy on both pods (two copies), so every pod holds something
        "placement": {"replicas": ["ms-0", "ms-1"], "target": ["ms-0", "ms-1"], "copies": 2, "load": 3.0},
        "replicas": {pod: {"loaded": True, "loadedAt": loaded_at, "load": 1.5} for pod in ("ms-0", "ms-1")},
    }
    observation = plan.Observation(
        key=("ns", "ms"),
        server=ServerEntry(key=("ns", "ms"), uid="u", generation=1),
        children=frozenset(),
        adapters=[entry("a", a), entry("b", b)],
        placed=server,
        known=ServerWrites(),
        judge=[],
        now=NOW,
        wall=datetime.datetime.fromtimestamp(NOW, datetime.UTC),
    )
    planned = plan.plan(observation).placements
    assert set(planned.changes) == {"a"}
    moved = planned.changes["a"]
    assert moved is not None and (moved.target, moved.draining, moved.copies) == (["ms-1"], ["ms-0"], 1)
