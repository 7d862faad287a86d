"""One pass's decisions over one ModelServer, pure: from what the pass observed (kopf's indexes and a few reads) and
what this operator wrote before (expectations.py), the writes to make and when to look again. control/controller.py
observes, calls `plan`, and applies what it returns.

The plan covers, in the order they are applied: the adapters' placements (with spec.placement), the roll-ups of the
adapters whose inputs moved (their status patches and Events), then the server: a reconcile of its children and
status (model_servers.reconcile) when something they are rendered from moved since the last one, else its adapter
counts when they moved; and the seconds until a drain time ends, when the server wants another pass.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple

from moelora.api import AdapterPlacement
from moelora.operator.decide import assignment, indexes, rollup, routes, status
from moelora.operator.decide.expectations import ServerKey, ServerWrites, resource_version
from moelora.operator.decide.indexes import AdapterEntry, ChildEntry, ServerEntry

# A little after a drain time ends, so the pass then finds it ended.
RECHECK_MARGIN = 0.1


class Rendered(NamedTuple):
    """What a reconcile of a server rendered from; another reconcile is due when any of it moves."""

    server: ServerEntry  # which object, at which spec (generation)
    children: frozenset[ChildEntry]  # the children it watches, with digests of what they hold
    secrets: frozenset[str]  # the Secrets its Role grants
    assigned_pods: int  # pods placement's assignments name (its StatefulSet's size)
    short: tuple[int, int]  # (adapters, copies) placement found no room for (its Degraded condition)


def judgement(
    body: Mapping[str, Any], *, written: int, server: ServerEntry | None, pods: Mapping[str, bool]
) -> Hashable:
    """What an adapter's roll-up is judged from, as one value: the index's copy and this operator's last status
    write (`written`, 0: none) by their versions, whether its server exists and at which spec, the server's pods.
    Judged once with nothing (more) to write, the same value needs no judging again."""
    generation = server.generation if server is not None else None
    return (resource_version(body), written, generation, frozenset(pods.items()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToJudge:
    """An adapter whose judgement moved, with what its roll-up reads."""

    body: Mapping[str, Any]  # the freshest copy: the index's, or with this operator's newer status write
    inputs: Hashable  # its judgement
    pods: Mapping[str, bool]  # the server's pods, and those its status names that only the API server has
    refused: str | None = None  # why policy refuses its source (SourceNotAllowed)
    remember: bool = True  # False when pods the index lacks were read: `inputs` do not hold all it was judged from


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    key: ServerKey
    server: ServerEntry | None  # None: gone, or not in the index yet
    children: frozenset[ChildEntry]
    adapters: list[AdapterEntry]  # the index's, with the phases of this operator's newer writes
    placed: assignment.Server | None  # placement's inputs (None: not placed, or gone)
    known: ServerWrites  # this operator's own writes to the server and its adapters' placements
    judge: list[ToJudge]
    now: float  # epoch seconds
    wall: datetime.datetime  # the same, as conditions stamp it
    pods: Mapping[str, bool] = dataclasses.field(default_factory=dict)  # the server's pods -> ready


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rollup:
    body: Mapping[str, Any]
    patch: dict[str, Any]  # the status merge patch; empty: nothing to write
    emission: rollup.Emission | None  # the Event of the transition, posted once the patch is stored
    inputs: Hashable
    remember: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Placements:
    changes: dict[str, AdapterPlacement | None]  # adapter -> its new status.placement (None: removed)
    cleared: dict[str, list[str]]  # adapter -> pods whose status entries go with the change (newly assigned)
    loaded: dict[tuple[str, str], float]  # (adapter, pod) -> the loadedAt of a cleared entry that read loaded
    kept: ServerWrites  # the server's placement record, pruned of adapters gone, before these writes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    placements: Placements
    rollups: list[Rollup]
    adapters: list[AdapterEntry]  # with the phases the roll-ups leave them in
    reconcile: Rendered | None  # reconcile the server, rendering from this
    counts: dict[str, int] | None  # status.adapters once applied; None when the server is gone
    write_counts: bool  # write `counts` alone (no reconcile)
    again: float | None  # seconds until the next pass it needs
    routes: dict[str, str | None] = dataclasses.field(default_factory=dict)  # adapter -> its new route (routes.py)


def follows_adapters(known: ServerWrites, adapters: list[AdapterEntry]) -> bool:
    """Whether the server's last reconcile rendered from the adapters as they are: its Role grants the Secrets they
    name."""
    return known.rendered is not None and known.rendered.secrets == indexes.adapter_secrets(adapters)


def place(observation: Observation) -> tuple[Placements, float | None]:
    """The placements to write, and the epoch seconds when a drain time ends (None: nothing waits on time)."""
    known = observation.known
    states = [entry.placed for entry in observation.adapters if entry.placed is not None]
    names = {state.name for state in states}
    kept = dataclasses.replace(
        known,
        placements={name: placed for name, placed in known.placements.items() if name in names},
        cleared={pair: at for pair, at in known.cleared.items() if pair[0] in names},
    )
    # The index learns our writes only when their events come back: what we wrote last is the newer truth, and
    # an entry we cleared still reads loaded there until then (a fresh load has another loadedAt).
    states = [
        dataclasses.replace(
            state,
            current=kept.placements.get(state.name, state.current),
            loaded_on=still_loaded(state, kept.cleared),
        )
        for state in states
    ]
    new: dict[str, AdapterPlacement | None]
    recheck = None
    if observation.placed is None:  # placement turned off (or the server gone): clear what an earlier one assigned
        new = {state.name: None for state in states}
    else:
        assigned, recheck = assignment.assign(observation.placed, states, now=observation.now)
        new = dict(assigned)
    changes = {state.name: new[state.name] for state in states if state.current != new[state.name]}
    # A pod newly assigned has not loaded the adapter: an entry it left from an earlier stint is stale.
    by_name = {state.name: state for state in states}
    cleared = {
        name: [pod for pod in placed.replicas if pod not in by_name[name].assigned]
        for name, placed in changes.items()
        if placed is not None
    }
    loaded = {
        (name, pod): by_name[name].loaded_on[pod]
        for name, pods in cleared.items()
        for pod in pods
        if pod in by_name[name].loaded_on
    }
    return Placements(changes=changes, cleared=cleared, loaded=loaded, kept=kept), recheck


def still_loaded(state: assignment.AdapterState, cleared: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """The adapter's loaded entries but those cleared (`cleared`: (adapter, pod) -> the loadedAt the cleared entry
    had; a fresh load has another)."""
    return {pod: at for pod, at in state.loaded_on.items() if cleared.get((state.name, pod)) != at}


def route(observation: Observation, placements: Placements, adapters: list[AdapterEntry]) -> dict[str, str | None]:
    """The adapters whose route (routes.header) differs from what this operator last wrote, with the new one. A
    server not seen yet changes none; an adapter of a server without gateway routing, none this operator has not
    written (a ConfigMap left from before its start keeps mapping the name to its old server)."""
    server = observation.server
    if server is None:
        return {}
    written = {**placements.kept.placements, **placements.changes}
    cleared = {**placements.kept.cleared, **placements.loaded}  # before this pass, and by it
    known = observation.known.routes
    changes: dict[str, str | None] = {}
    for entry in adapters:
        state = entry.placed
        placed = written[entry.name] if entry.name in written else (state.current if state else None)
        loaded = still_loaded(state, cleared) if state else {}
        value = routes.header(entry, server.routing, placed=placed, loaded=loaded, ready=observation.pods)
        if value is None and known.get(entry.name) is None:
            continue
        if entry.name not in known or known[entry.name] != value:
            changes[entry.name] = value
    return changes


def roll_up(observation: Observation) -> list[Rollup]:
    """The status patch of each adapter to judge (rollup.render_status_patch) and its Event."""
    rollups = []
    for judged in observation.judge:
        judge = rollup.Observation(
            body=judged.body, server_exists=observation.server is not None, pods=judged.pods, refused=judged.refused
        )
        patch = rollup.render_status_patch(judge, now=observation.wall)
        emission = rollup.adapter_transition(judged.body.get("status") or {}, patch) if patch else None
        rollups.append(
            Rollup(body=judged.body, patch=patch, emission=emission, inputs=judged.inputs, remember=judged.remember)
        )
    return rollups


def plan(observation: Observation) -> Plan:
    placements, recheck = place(observation)
    rollups = roll_up(observation)
    again = None if recheck is None else max(0.0, recheck - observation.now) + RECHECK_MARGIN
    new_phases = {r.body["metadata"]["name"]: r.patch["phase"] for r in rollups if r.patch.get("phase")}
    adapters = [entry._replace(phase=new_phases.get(entry.name, entry.phase)) for entry in observation.adapters]
    server = observation.server
    if server is None:  # its adapters say it is gone; the garbage collector takes its children
        return Plan(
            placements=placements,
            rollups=rollups,
            adapters=adapters,
            reconcile=None,
            counts=None,
            write_counts=False,
            again=again,
        )
    written = {**placements.kept.placements, **placements.changes}
    new_routes = route(observation, placements, adapters)
    rendered = Rendered(
        server=server,
        children=observation.children,
        secrets=indexes.adapter_secrets(adapters),
        assigned_pods=indexes.assigned_pods(written, observation.key[1], adapters),
        short=indexes.placement_short(written, adapters),
    )
    known = observation.known
    counts = status.adapter_counts([entry.phase for entry in adapters]).to_wire()
    reconcile = known.rendered != rendered or not follows_adapters(known, adapters)
    return Plan(
        placements=placements,
        rollups=rollups,
        adapters=adapters,
        reconcile=rendered if reconcile else None,
        counts=counts,
        write_counts=not reconcile and known.counted != counts,
        again=again,
        routes=new_routes,
    )
