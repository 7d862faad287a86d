"""`placement.follow`: copies go where the router sends each adapter, with a margin against flapping."""

from __future__ import annotations

from moelora.operator.decide.placement import Adapter, Replica, follow, place

PODS = [Replica(f"ms-{i}") for i in range(4)]


def test_a_copy_moves_to_the_pod_loading_its_adapter_on_demand() -> None:
    # a is placed on ms-0 but the picker sends it to ms-2, which loads it on demand: the copy follows it.
    # Every pod holds something (no pod is new to place, which would take its rendezvous share first).
    current = {"a": ("ms-0",), "b": ("ms-1", "ms-2", "ms-3")}
    homes = follow({"a": {"ms-0": 0.1, "ms-2": 1.0}}, current, {"a": 1, "b": 3})
    assert homes == {"a": ("ms-2",), "b": ("ms-1", "ms-2", "ms-3")}
    assert place([Adapter("a", 1), Adapter("b", 1, replicas=3)], PODS, homes).homes["a"] == ("ms-2",)


def test_a_current_home_stays_unless_another_pod_carries_clearly_more() -> None:
    current = {"a": ("ms-0",)}
    assert follow({"a": {"ms-0": 1.0, "ms-1": 1.4}}, current, {"a": 1}) == {"a": ("ms-0",)}  # 1.4 < 1.5 x 1.0
    assert follow({"a": {"ms-0": 1.0, "ms-1": 1.6}}, current, {"a": 1}) == {"a": ("ms-1",)}
    assert follow({"a": {"ms-0": 1.0, "ms-1": 1.6}}, current, {"a": 1}, keep_margin=2.0) == {"a": ("ms-0",)}


def test_copies_go_only_where_load_is_and_an_adapter_with_none_keeps_its_homes() -> None:
    # Up to three copies: a pod carries its load, so one copy there; the idle home gives its disk back.
    assert follow({"a": {"ms-3": 0.5, "ms-1": 0.0}}, {"a": ("ms-0",)}, {"a": 3}) == {"a": ("ms-3",)}
    # b has no load anywhere: its homes stay as they are
    assert follow({"b": {"ms-0": 0.0}}, {"b": ("ms-1", "ms-3")}, {"b": 1}) == {"b": ("ms-1", "ms-3")}


def test_at_most_copies_the_busiest_first_and_a_new_adapter_goes_where_it_is_served() -> None:
    loads = {"a": {"ms-0": 0.2, "ms-1": 3.0, "ms-2": 1.0}}
    assert follow(loads, {"a": ("ms-0", "ms-1", "ms-2")}, {"a": 2}) == {"a": ("ms-1", "ms-2")}
    assert follow(loads, {}, {}) == {"a": ("ms-1", "ms-2", "ms-0")}  # no cap given: every loaded pod
    assert follow({"c": {"ms-2": 0.3, "ms-0": 0.6}}, {}, {"c": 1}) == {"c": ("ms-0",)}
