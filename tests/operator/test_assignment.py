"""The operator's assignment of adapters to a placed server's pods: placement over stable pod names, moved
make-before-break from what each adapter's status already says."""

from __future__ import annotations

import datetime
import random

from moelora.api import AdapterPlacement
from moelora.operator.decide import placement, status
from moelora.operator.decide.assignment import AdapterState, Server, pod_names, pods_needed
from moelora.operator.decide.assignment import assign as place_now
from moelora.operator.decide.indexes import adapters_index, placement_index

NOW = 1_000_000.0


def server(replicas: int, *, copies: int = 1, disk_bytes: int | None = None, drain: float = 0.0) -> Server:
    return Server(name="ms", replicas=replicas, copies=copies, disk_bytes=disk_bytes, drain_seconds=drain)


def assign(server: Server, adapters: list[AdapterState], now: float = NOW) -> dict[str, AdapterPlacement]:
    return place_now(server, adapters, now=now)[0]


def loaded(pods: list[str], at: float = NOW - 100) -> dict[str, float]:
    return dict.fromkeys(pods, at)


def settled(adapters: list[AdapterState], result: dict[str, AdapterPlacement]) -> list[AdapterState]:
    """The adapters once every assigned pod has reported them loaded."""
    return [
        AdapterState(name=a.name, copies=a.copies, current=result[a.name], loaded_on=loaded(result[a.name].replicas))
        for a in adapters
    ]


def names(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"team{rng.randrange(10**6)}-adapter-{i}" for i in range(count)]


def test_first_assignment_is_placement_over_the_statefulset_pod_names() -> None:
    adapters = [AdapterState(name=name) for name in names(20)]
    result = assign(server(3), adapters)
    expected = placement.place(
        [placement.Adapter(a.name, size_bytes=0) for a in adapters], [placement.Replica(p) for p in pod_names("ms", 3)]
    )
    assert {name: tuple(p.replicas) for name, p in result.items()} == dict(expected.homes)
    assert all(p.draining == [] and p.target == p.replicas for p in result.values())


def test_copies_per_adapter_from_its_spec_else_the_servers_default() -> None:
    adapters = [AdapterState(name="hot", copies=3), AdapterState(name="cold")]
    result = assign(server(4, copies=2), adapters)
    assert len(result["hot"].replicas) == 3 and len(set(result["hot"].replicas)) == 3
    assert len(result["cold"].replicas) == 2
    assert len(assign(server(2), [AdapterState(name="hot", copies=5)])["hot"].replicas) == 2  # clamped


def test_scale_out_moves_only_what_placement_predicts_and_keeps_old_homes_until_the_new_load() -> None:
    adapters = [AdapterState(name=name) for name in names(500)]
    before = settled(adapters, assign(server(16), adapters))
    during = assign(server(17), before)
    predicted = placement.place(
        [placement.Adapter(a.name, 0) for a in adapters], [placement.Replica(p) for p in pod_names("ms", 17)]
    )
    moved = {a.name for a in before if during[a.name].target != list(a.assigned)}
    assert moved == {
        name
        for name, homes in predicted.homes.items()
        if homes != tuple(next(a for a in before if a.name == name).assigned)
    }
    # Every move goes to the new pod, and about 1/17 of the adapters move (binomial, 5 sigma).
    assert all(during[name].target == ["ms-16"] for name in moved)
    expected, sigma = 500 / 17, (500 * (1 / 17) * (16 / 17)) ** 0.5
    assert abs(len(moved) - expected) < 5 * sigma
    # Make-before-break: the old home stays assigned (draining) until the new one reports loaded.
    for a in before:
        if a.name in moved:
            assert during[a.name].replicas == ["ms-16", *a.assigned]
            assert during[a.name].draining == list(a.assigned)
        else:
            assert during[a.name] == a.current
    # The new pod reports some of them loaded: exactly those drop their old home.
    reported = sorted(moved)[: len(moved) // 2]
    progressed = [
        AdapterState(
            name=a.name,
            current=during[a.name],
            loaded_on={**a.loaded_on, **(loaded(["ms-16"]) if a.name in reported else {})},
        )
        for a in before
    ]
    after = assign(server(17), progressed)
    for name in moved:
        assert after[name].replicas == (["ms-16"] if name in reported else during[name].replicas)


def test_scale_in_drains_the_removed_pods_before_the_statefulset_shrinks() -> None:
    adapters = [AdapterState(name=name) for name in names(40)]
    before = settled(adapters, assign(server(4), adapters))
    during = assign(server(3), before)
    leaving = [a.name for a in before if "ms-3" in a.assigned]
    assert leaving and all(during[name].draining == ["ms-3"] for name in leaving)
    assert pods_needed((p.replicas for p in during.values()), server="ms") == 4
    done = settled(adapters, during)  # every target home reports loaded (the draining pod still too)
    after = assign(server(3), done)
    assert all("ms-3" not in p.replicas for p in after.values())
    assert pods_needed((p.replicas for p in after.values()), server="ms") == 3


def test_disk_budget_from_the_adapter_cache_bounds_each_pod() -> None:
    adapters = [AdapterState(name=name, size_bytes=10) for name in names(30)]
    result = assign(server(3, disk_bytes=100), adapters)
    per_pod: dict[str, int] = {}
    for p in result.values():
        for pod in p.replicas:
            per_pod[pod] = per_pod.get(pod, 0) + 10
    assert max(per_pod.values()) <= 100
    assert sum(p.short for p in result.values()) == 30 - sum(len(p.replicas) for p in result.values())


def test_auto_copies_from_the_agents_load_are_written_with_the_placement() -> None:
    auto = Server(name="ms", replicas=3, copies=1, disk_bytes=None, auto=True, slots=4)
    adapters = [
        AdapterState(name="hot", load=9.0),
        AdapterState(name="warm", load=1.5),
        AdapterState(name="pinned", copies=1, load=1.5),  # its own spec.replicas wins
        AdapterState(name="idle"),
    ]
    result = assign(auto, adapters)
    assert {name: (len(p.target), p.copies, p.load) for name, p in result.items()} == {
        "hot": (3, 3, 9.0),
        "warm": (2, 2, 1.5),  # 1.5 of 12 in flight: ceil(1.5 / 12 x 3 replicas x 4 slots) = 2
        "pinned": (1, 1, 1.5),
        "idle": (1, 1, 0.0),
    }
    # Warm's load falls to 0.9 of 12: one copy would do, but with half again its load (1.35) it would need two, so
    # it keeps them; at 0.6 of 12 (0.9 with the margin) it gives one back.
    states = {a.name: AdapterState(name=a.name, copies=a.copies, load=a.load, current=result[a.name]) for a in adapters}
    for warm, copies in ((0.9, 2), (0.6, 1)):
        states["warm"] = AdapterState(name="warm", load=warm, current=result["warm"])
        states["hot"] = AdapterState(name="hot", load=10.5 - warm, current=result["hot"])
        assert assign(auto, list(states.values()))["warm"].copies == copies


def test_routing_to_homes_places_each_adapter_on_one_pod_or_on_all() -> None:
    """routeToHome: the copies rule's count becomes one pod, or every pod once it reaches them; spec.replicas wins."""
    homes = Server(name="ms", replicas=3, copies=1, disk_bytes=None, auto=True, slots=4, one_or_all=True)
    adapters = [
        AdapterState(name="hot", load=9.0),  # the rule: 3 copies, every pod
        AdapterState(name="warm", load=1.5),  # the rule: 2 copies, so one
        AdapterState(name="pinned", copies=2, load=1.5),  # its own spec.replicas
        AdapterState(name="idle"),
    ]
    result = assign(homes, adapters)
    assert {name: (len(p.target), p.copies) for name, p in result.items()} == {
        "hot": (3, 3),
        "warm": (1, 1),
        "pinned": (2, 2),
        "idle": (1, 1),
    }
    fixed = Server(name="ms", replicas=3, copies=2, disk_bytes=None, one_or_all=True)
    assert {len(p.target) for p in assign(fixed, adapters[1:2]).values()} == {1}
    spec = {
        "model": {"name": "m"},
        "replicas": 3,
        "placement": {},
        "routing": {"gateway": {"enabled": True, "routeToHome": True}},
    }
    assert placement_index(spec=spec, name="ms", namespace="ns")[("ns", "ms")].one_or_all
    spec["routing"]["gateway"]["enabled"] = False  # no gateway, no homes to route to
    assert not placement_index(spec=spec, name="ms", namespace="ns")[("ns", "ms")].one_or_all


def test_a_pod_holds_at_most_its_count_and_the_rest_is_short() -> None:
    adapters = [AdapterState(name=name) for name in names(30)]
    result = assign(Server(name="ms", replicas=3, copies=1, disk_bytes=None, max_adapters=8), adapters)
    per_pod: dict[str, int] = {}
    for p in result.values():
        for pod in p.replicas:
            per_pod[pod] = per_pod.get(pod, 0) + 1
    assert per_pod == {"ms-0": 8, "ms-1": 8, "ms-2": 8}
    assert sum(p.short for p in result.values()) == 6


def test_the_indexes_carry_placements_inputs() -> None:
    spec = {"model": {"name": "m"}, "replicas": 3, "placement": {"copies": 2}, "adapterCache": {"sizeLimit": "1Gi"}}
    # vLLM keeps maxLoras (default 8) adapters in CPU memory unless maxCpuLoras says more; 4 per slot by default.
    assert placement_index(spec=spec, name="ms", namespace="ns") == {
        ("ns", "ms"): Server(
            name="ms",
            replicas=3,
            copies=2,
            disk_bytes=2**30,
            drain_seconds=30.0,
            max_adapters=32,
            slots=8,
            on_demand_slots=8,
        )
    }
    spec["lora"] = {"maxLoras": 4, "maxCpuLoras": 6}
    spec["placement"] = {"copies": 1, "copiesMode": "Auto", "adaptersPerCpuLora": 2}
    assert placement_index(spec=spec, name="ms", namespace="ns")[("ns", "ms")] == Server(
        name="ms",
        replicas=3,
        copies=1,
        disk_bytes=2**30,
        drain_seconds=30.0,
        max_adapters=12,
        auto=True,
        slots=6,
        on_demand_slots=4,
    )
    assert placement_index(spec={"model": {"name": "m"}}, name="ms", namespace="ns") is None
    status = {
        "sizeBytes": 7,
        "placement": {"replicas": ["ms-1", "ms-0"], "target": ["ms-1"], "draining": ["ms-0"]},
        "replicas": {"ms-0": {"loaded": True, "load": 0.5}, "ms-1": {"loaded": False, "load": 0.25}},
    }
    spec = {"modelServer": "ms", "replicas": 2}
    body = {"metadata": {"name": "a", "namespace": "ns"}, "spec": spec, "status": status}
    entry = adapters_index(body=body, spec=spec, status=status, name="a", namespace="ns")
    placed = entry[("ns", "ms")].placed
    assert placed is not None
    assert (placed.copies, placed.size_bytes, placed.assigned, placed.loaded_on, placed.load) == (
        2,
        7,
        ("ms-1", "ms-0"),
        {"ms-0": 0.0},
        0.75,
    )


def test_the_roll_up_counts_only_the_assigned_pods_and_prunes_the_others() -> None:
    raw = {"replicas": {"ms-0": {"loaded": True, "state": "Loaded"}, "ms-1": {"loaded": True, "state": "Loaded"}}}
    patch = status.adapter_status_patch(
        raw,
        served_name="a",
        generation=1,
        server_exists=True,
        pods={"ms-0": True, "ms-1": True, "ms-2": True},
        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        assigned=["ms-0"],
    )
    assert patch["phase"] == "Loaded" and patch["desiredReplicas"] == 1 and patch["loadedReplicas"] == 1
    assert patch["replicas"] == {"ms-1": None}  # it left ms-1: its entry must not count as loaded there later


def test_the_old_home_drains_for_drain_seconds_after_the_new_one_loaded() -> None:
    before = settled(
        [AdapterState(name=name) for name in names(40)], assign(server(3), [AdapterState(name=n) for n in names(40)])
    )
    mover = next(a for a in before if "ms-2" in a.assigned)
    target = assign(server(2), [mover])[mover.name].target
    moving = AdapterState(
        name=mover.name,
        current=AdapterPlacement(replicas=[*target, "ms-2"], target=target, draining=["ms-2"]),
        loaded_on={"ms-2": NOW - 500, target[0]: NOW - 10},
    )
    slow = server(2, drain=30)
    kept, recheck = place_now(slow, [moving], now=NOW)
    assert kept[mover.name].draining == ["ms-2"] and recheck == NOW + 20
    gone, recheck = place_now(slow, [moving], now=NOW + 20)
    assert gone[mover.name].replicas == target and recheck is None


def test_a_new_home_with_a_stale_loaded_entry_does_not_end_the_move() -> None:
    # The new home held the adapter before and its entry still says loaded: it is not in the assignment yet, so
    # the move to it has only begun and the current home stays.
    current = AdapterPlacement(replicas=["ms-9"], target=["ms-9"])
    (home,) = assign(server(3), [AdapterState(name="a", current=current)])["a"].target
    back = AdapterState(name="a", current=current, loaded_on=loaded(["ms-9", home]))
    assert assign(server(3), [back])["a"].replicas == [home, "ms-9"]


def test_scale_out_of_full_pods_moves_only_the_new_pods_share() -> None:
    # Disks with 5% to spare: copies spill past full pods, and placement from the names alone would move spilled
    # copies between old pods too (1.24 / 17 of them here).
    adapters = [AdapterState(name=name, size_bytes=100) for name in names(1000)]
    disk = int(1.05 * 1000 * 100 / 16)
    before = settled(adapters, assign(server(16, disk_bytes=disk), adapters))
    before = [AdapterState(name=a.name, size_bytes=100, current=a.current, loaded_on=a.loaded_on) for a in before]
    during = assign(server(17, disk_bytes=disk), before)
    old = {a.name: a.assigned for a in before}
    new = {name: tuple(p.target) for name, p in during.items()}
    assert placement.moved(old, new) <= 1.2 / 17 * 1000
    assert all(set(new[name]) - set(old[name]) <= {"ms-16"} for name in new)


def test_auto_copies_count_the_load_non_holders_serve_on_demand() -> None:
    # The picker sends most of hot's requests to pods not assigned it: their agents report that load under
    # status.onDemandLoad, and it counts as hot's load (one pod's report in both places, briefly, counts once).
    status = {
        "placement": {"replicas": ["ms-0"], "target": ["ms-0"]},
        "replicas": {"ms-0": {"loaded": True, "load": 0.5}},
        "onDemandLoad": {"ms-1": 4.0, "ms-2": 4.0, "ms-0": 0.5},
    }
    spec = {"modelServer": "ms"}
    body = {"metadata": {"name": "hot", "namespace": "ns"}, "spec": spec, "status": status}
    hot = adapters_index(body=body, spec=spec, status=status, name="hot", namespace="ns")[("ns", "ms")].placed
    assert hot is not None and hot.load == 8.5
    cold = AdapterState(name="cold", load=0.5, current=AdapterPlacement(replicas=["ms-1"], target=["ms-1"]))
    auto = Server(name="ms", replicas=3, copies=1, disk_bytes=None, auto=True, slots=4)
    # 8.5 of 9 in flight: ceil(8.5 / 9 x 3 replicas x 4 slots) = 12, clamped to 3 (its holders' 0.5 alone: 1 copy).
    assert assign(auto, [hot, cold])["hot"].copies == 3


def test_the_roll_up_prunes_on_demand_load_of_pods_gone_or_now_assigned() -> None:
    raw = {
        "replicas": {"ms-0": {"loaded": True, "state": "Loaded"}},
        "onDemandLoad": {"ms-1": 1.0, "ms-2": 2.0, "ms-7": 3.0},
    }
    patch = status.adapter_status_patch(
        raw,
        served_name="a",
        generation=1,
        server_exists=True,
        pods={"ms-0": True, "ms-1": True, "ms-2": True},
        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        assigned=["ms-0", "ms-1"],
    )
    assert patch["onDemandLoad"] == {"ms-1": None, "ms-7": None}  # ms-2 serves it on demand: its load stays


def test_placed_copies_leave_each_pods_disk_room_for_max_loras_adapters_on_demand() -> None:
    # 100 bytes each, 1,000 of disk, maxLoras 2: placed copies fill at most 800, so a request for any adapter
    # placed elsewhere finds room for it on any pod (with the whole disk placed, the agent would answer 503).
    adapters = [AdapterState(name=name, size_bytes=100) for name in names(40)]
    full = Server(name="ms", replicas=3, copies=1, disk_bytes=1000, on_demand_slots=2)
    per_pod: dict[str, int] = {}
    for p in assign(full, adapters).values():
        for pod in p.replicas:
            per_pod[pod] = per_pod.get(pod, 0) + 100
    assert max(per_pod.values()) == 800 and sum(per_pod.values()) == 2400
    assert placement.placed_budget(None, on_demand_slots=8, largest=100) is None
    assert placement.placed_budget(500, on_demand_slots=8, largest=100) == 0
