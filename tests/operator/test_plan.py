"""A pass's plan over one server, pure (plan.py): when the server is reconciled and when only its counts are written,
what the adapters' roll-ups write and count, what placement writes and when it asks for the key again."""

from __future__ import annotations

import datetime
from typing import Any

from moelora.api import AdapterPlacement
from moelora.operator.decide import plan
from moelora.operator.decide.assignment import AdapterState, Server
from moelora.operator.decide.expectations import ServerWrites
from moelora.operator.decide.indexes import AdapterEntry, ChildEntry, GatewayRouting, ServerEntry

KEY = ("ns", "ms")
NOW = 1_000_000.0
WALL = datetime.datetime(2026, 12, 3, 18, 0, tzinfo=datetime.UTC)
SERVER = ServerEntry(key=KEY, uid="u1", generation=3)
DEPLOYMENT = frozenset({ChildEntry(kind="Deployment", name="ms", digest="7")})


def adapter(name: str, *, phase: str = "Pending", replicas: dict | None = None, **entry: Any) -> AdapterEntry:
    body = {
        "metadata": {"name": name, "namespace": "ns", "generation": 1, "resourceVersion": "5"},
        "spec": {"modelServer": "ms", "source": {"uri": f"s3://bucket/{name}/"}},
        "status": {"phase": phase, "replicas": replicas or {}},
    }
    return AdapterEntry(name=name, phase=phase, body=body, **entry)


def observe(adapters: list[AdapterEntry], *, known: ServerWrites | None = None, **fields: Any) -> plan.Observation:
    """What a pass observes; every adapter judged (ready pod ms-0) unless `judge` says otherwise."""
    pods = fields.pop("pods", {"ms-0": True})
    server = fields.pop("server", SERVER)
    judge = [
        plan.ToJudge(body=entry.body, inputs=plan.judgement(entry.body, written=0, server=server, pods=pods), pods=pods)
        for entry in adapters
    ]
    return plan.Observation(
        key=KEY,
        server=server,
        children=fields.pop("children", DEPLOYMENT),
        adapters=adapters,
        placed=fields.pop("placed", None),
        known=known or ServerWrites(),
        judge=fields.pop("judge", judge),
        now=NOW,
        wall=WALL,
        pods=pods,
        **fields,
    )


def settled(observation: plan.Observation) -> ServerWrites:
    """What the operator knows once the plan is applied."""
    planned = plan.plan(observation)
    return ServerWrites(rendered=planned.reconcile or observation.known.rendered, counted=planned.counts)


def test_a_server_is_reconciled_once_then_again_only_when_what_it_renders_from_moves() -> None:
    adapters = [adapter("a", secret="s3-a")]
    first = plan.plan(observe(adapters))
    assert first.reconcile == plan.Rendered(
        server=SERVER, children=DEPLOYMENT, secrets=frozenset({"s3-a"}), assigned_pods=0, short=(0, 0)
    )
    known = settled(observe(adapters))
    again = plan.plan(observe(adapters, known=known, judge=[]))
    assert again.reconcile is None and not again.write_counts and again.again is None
    moved = {
        "a new spec": {"server": SERVER._replace(generation=4)},
        "the server deleted and created again": {"server": SERVER._replace(uid="u2")},
        "its Deployment's status": {"children": frozenset({ChildEntry(kind="Deployment", name="ms", digest="8")})},
    }
    for what, fields in moved.items():
        assert plan.plan(observe(adapters, known=known, judge=[], **fields)).reconcile is not None, what
    other_secret = [adapter("a", secret="s3-b")]
    assert plan.plan(observe(other_secret, known=known, judge=[])).reconcile is not None


def test_a_phase_change_alone_writes_the_counts_the_rollups_leave() -> None:
    """The agent reports the adapter loaded on the ready pod: the roll-up writes Loaded, and the server's counts
    are written with it from the plan (the index has not seen the roll-up's write yet), without a reconcile."""
    known = settled(observe([adapter("a")]))
    loaded = adapter("a", replicas={"ms-0": {"loaded": True, "state": "Loaded"}})
    planned = plan.plan(observe([loaded], known=known))
    assert [rollup.patch.get("phase") for rollup in planned.rollups] == ["Loaded"]
    assert planned.rollups[0].emission is not None and planned.rollups[0].emission.reason == "Loaded"
    assert planned.reconcile is None and planned.write_counts
    assert planned.counts == {"desired": 1, "loaded": 1, "failed": 0}


def test_two_adapters_failing_are_both_counted() -> None:
    """Each phase comes from the newest of the index and this operator's writes (indexes.adapter_phases gives the
    plan both Failed); the counts the plan writes hold both."""
    known = settled(observe([adapter("a"), adapter("b")]))
    failed = [adapter("a", phase="Failed"), adapter("b", phase="Failed")]
    planned = plan.plan(observe(failed, known=known, judge=[]))
    assert planned.write_counts and planned.counts == {"desired": 2, "loaded": 0, "failed": 2}


def test_a_gone_server_fails_its_adapters_and_reconciles_nothing() -> None:
    planned = plan.plan(observe([adapter("a")], server=None))
    assert planned.rollups[0].patch["phase"] == "Failed"
    assert [c["reason"] for c in planned.rollups[0].patch["conditions"] if c["type"] == "Ready"] == [
        "ModelServerNotFound"
    ]
    assert planned.reconcile is None and planned.counts is None and not planned.write_counts


def test_an_adapter_judged_with_nothing_to_write_plans_no_write() -> None:
    once = plan.plan(observe([adapter("a")]))
    body = {**once.rollups[0].body, "status": {**once.rollups[0].body["status"], **once.rollups[0].patch}}
    same = plan.plan(observe([adapter("a")._replace(body=body)]))
    assert same.rollups[0].patch == {} and same.rollups[0].emission is None


def placed_adapter(name: str, current: AdapterPlacement | None, loaded_on: dict[str, float]) -> AdapterEntry:
    state = AdapterState(name=name, current=current, loaded_on=loaded_on)
    return adapter(name, placed=state)


def test_placement_writes_changes_and_asks_for_the_key_again_when_a_drain_time_ends() -> None:
    """A move from ms-2 to ms-0, loaded on ms-0 10 s ago with 30 s of drain: ms-2 stays assigned, the key comes
    back 20 s later; with placement turned off the assignment is cleared."""
    server = Server(name="ms", replicas=2, copies=1, disk_bytes=None, drain_seconds=30.0)
    target = next(iter(plan.assignment.assign(server, [AdapterState(name="a")], now=NOW)[0]["a"].target))
    loaded_on = {"ms-2": NOW - 500, target: NOW - 10}
    moving = AdapterPlacement(replicas=[target, "ms-2"], target=[target], draining=["ms-2"])
    current = plan.assignment.assign(server, [AdapterState(name="a", current=moving, loaded_on=loaded_on)], now=NOW)
    entry = placed_adapter("a", current[0]["a"], loaded_on)  # as the operator wrote it
    planned = plan.plan(observe([entry], placed=server, judge=[]))
    assert planned.placements.changes == {} and planned.again == 20.0 + plan.RECHECK_MARGIN
    assert planned.reconcile is not None and planned.reconcile.assigned_pods == 3  # ms-2 still named
    off = plan.plan(observe([entry], placed=None, judge=[]))
    assert off.placements.changes == {"a": None} and off.again is None
    assert off.reconcile is not None and off.reconcile.assigned_pods == 0


def test_placement_reads_its_own_writes_over_the_index() -> None:
    """What the operator wrote last is the newer truth until the index has it: the same assignment is not
    written twice, and the server is rendered from it."""
    server = Server(name="ms", replicas=2, copies=1, disk_bytes=None, drain_seconds=0.0)
    first = plan.plan(observe([placed_adapter("a", None, {})], placed=server, judge=[]))
    assert set(first.placements.changes) == {"a"}
    known = ServerWrites(placements=dict(first.placements.changes))
    second = plan.plan(observe([placed_adapter("a", None, {})], placed=server, judge=[], known=known))
    assert second.placements.changes == {}
    assert second.reconcile is not None and second.reconcile.assigned_pods >= 1


# --- routes: the header value each adapter's body-based router ConfigMap maps its name to ----------------------------

ROUTED = SERVER._replace(routing=GatewayRouting(base="base"))
HOMES = SERVER._replace(routing=GatewayRouting(base="base", home=True))
AT_HOME = AdapterPlacement(replicas=["ms-1"], target=["ms-1"], copies=1)


PLACED = Server(name="ms", replicas=2, copies=1, disk_bytes=None, drain_seconds=0.0, one_or_all=True)


def routes(entries: list[AdapterEntry], **fields: Any) -> dict[str, str | None]:
    """The routes a pass writes; with placement (copies 1 of 2 pods) unless `placed` says otherwise."""
    return plan.plan(observe(entries, judge=[], **{"placed": PLACED, **fields})).routes


def test_every_adapter_goes_through_the_pool_without_home_routing() -> None:
    entries = [adapter("a"), adapter("b", phase="Loaded", served="team/b"), adapter("c", phase="Failed")]
    assert routes(entries, server=ROUTED) == {"a": "base", "b": "base"}  # a Failed one is left unmapped
    known = ServerWrites(routes={"a": "base", "b": "base", "c": "base"})
    assert routes(entries, server=ROUTED, known=known) == {"c": None}  # written before it failed: deleted
    assert routes(entries, server=SERVER, known=known) == {"a": None, "b": None, "c": None}  # routing turned off
    assert routes(entries, server=SERVER) == {}  # none written by this operator: none to delete
    assert routes(entries, server=None, known=known) == {}  # a server not seen yet changes nothing
    assert routes([adapter("d", served="base")], server=ROUTED) == {}  # the server's own ConfigMap maps it


def test_an_adapter_goes_home_only_once_loaded_there_its_move_done_and_its_pod_ready() -> None:
    loaded = {"ms-1": NOW - 5}
    ready = {"ms-0": True, "ms-1": True}
    home = "base@ms-1"
    assert routes([placed_adapter("a", AT_HOME, loaded)], server=HOMES, pods=ready) == {"a": home}
    moving = AT_HOME.model_copy(update={"replicas": ["ms-1", "ms-0"], "draining": ["ms-0"]})
    not_yet = {  # (placement, pods it is loaded on, pods ready)
        "not loaded there": (AT_HOME, set(), ready),
        "its pod not ready": (AT_HOME, {"ms-1"}, {"ms-0": True, "ms-1": False}),
        "its pod gone": (AT_HOME, {"ms-1"}, {"ms-0": True}),
        "moving, old home draining": (moving, {"ms-1", "ms-0"}, ready),
        "on two pods": (AdapterPlacement(replicas=["ms-1", "ms-0"], target=["ms-1", "ms-0"]), {"ms-1"}, ready),
        "not placed": (None, {"ms-1"}, ready),
    }
    for what, (placed, on, pods) in not_yet.items():
        assert plan.routes.header(adapter("a"), HOMES.routing, placed=placed, loaded=on, ready=pods) == "base", what
    assert plan.routes.header(adapter("a"), HOMES.routing, placed=AT_HOME, loaded={"ms-1"}, ready=ready) == home
    # Without routeToHome the same adapter stays on the pool; once written, nothing is written again.
    assert routes([placed_adapter("a", AT_HOME, loaded)], server=ROUTED, pods=ready) == {"a": "base"}
    known = ServerWrites(routes={"a": home})
    assert routes([placed_adapter("a", AT_HOME, loaded)], server=HOMES, pods=ready, known=known) == {}


def test_a_home_this_pass_assigns_anew_is_not_loaded_whatever_its_old_entry_says() -> None:
    """A scale-down moves the adapter off ms-5 to a pod whose entry from an earlier stint reads loaded; the pass
    clears that entry, so the adapter goes through the pool until the new home reports it loaded again."""
    server = Server(name="ms", replicas=2, copies=1, disk_bytes=None, drain_seconds=0.0, one_or_all=True)
    was = AdapterPlacement(replicas=["ms-5"], target=["ms-5"], copies=1)
    entry = placed_adapter("a", was, {"ms-0": NOW - 100, "ms-1": NOW - 100, "ms-5": NOW - 100})
    ready = {"ms-0": True, "ms-1": True, "ms-5": True}
    planned = plan.plan(observe([entry], placed=server, server=HOMES, pods=ready, judge=[]))
    [new_home] = planned.placements.changes["a"].target
    assert new_home in ("ms-0", "ms-1") and planned.placements.cleared == {"a": [new_home]}
    assert planned.routes == {"a": "base"}
