"""Which pods of a placed ModelServer serve each adapter now: `placement.place` over the server's stable pod names,
from the target homes already in each adapter's status (kept wherever placement can, so a scale-out moves only the
new pods' share), moved make-before-break. Pure.

With copiesMode Auto the homes also follow the load (`placement.follow_place`): an adapter's copies go to the pods
the router sends it to (`status.replicas.<pod>.load` and `status.onDemandLoad`), a current home kept unless another
pod carries 1.5x its load. Fixed keeps the rendezvous homes that clients routing by status can predict.

An adapter's assignment (`status.placement.replicas`) is its target homes plus, while a move is under way, the old
homes that `placement.plan` may not unload yet: an old home leaves the assignment only once every target home's
agent reports the adapter loaded (`status.replicas.<pod>.loaded`) and `placement.drainSeconds` have passed since
(by the agents' `loadedAt`: clocks are assumed roughly in step). The agents serve exactly their pod's assignments,
so the adapter is served throughout a move. A scale-down drains the same way: the pods the assignments still name
are kept running (`pods_needed`) until their adapters are loaded elsewhere.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

from moelora.api import AdapterPlacement
from moelora.operator.decide import placement
from moelora.operator.render import naming


@dataclasses.dataclass(frozen=True, kw_only=True)
class Server:
    """A placed server's inputs to placement, from its spec."""

    name: str
    replicas: int
    copies: int  # spec.placement.copies: per adapter unless its own spec.replicas says otherwise
    disk_bytes: int | None  # spec.adapterCache.sizeLimit: each pod's budget
    drain_seconds: float = 0.0  # spec.placement.drainSeconds
    max_adapters: int | None = None  # each pod's count: placement.adaptersPerCpuLora x lora.maxCpuLoras
    auto: bool = False  # placement.copiesMode Auto: copies from the adapters' load
    slots: int = 1  # lora.maxCpuLoras (vLLM's default: maxLoras), the warm slots Auto shares the load over
    on_demand_slots: int = 0  # lora.maxLoras: adapters loaded on demand each pod's disk keeps room for
    one_or_all: bool = False  # routing.gateway.routeToHome: each adapter on one pod or on all (placement.one_or_all)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdapterState:
    """One adapter's inputs, from its spec and status."""

    name: str
    copies: int | None = None  # spec.replicas
    size_bytes: int = 0  # status.sizeBytes; 0 until an agent has read the files
    current: AdapterPlacement | None = None  # status.placement
    loaded_on: Mapping[str, float] = dataclasses.field(default_factory=dict)  # pod -> its loadedAt, epoch seconds
    load: float = 0.0  # requests in flight on every pod that serves it, assigned or on demand (indexes.adapter_load)
    pod_load: Mapping[str, float] = dataclasses.field(default_factory=dict)  # the same per pod (indexes.pod_load)

    @property
    def assigned(self) -> tuple[str, ...]:
        return tuple(self.current.replicas) if self.current is not None else ()


def pod_names(server: str, replicas: int) -> list[str]:
    """The StatefulSet's pod names, which are placement's replica identities."""
    return [naming.pod_name(server, ordinal) for ordinal in range(replicas)]


def assign(
    server: Server, adapters: Sequence[AdapterState], *, now: float
) -> tuple[dict[str, AdapterPlacement], float | None]:
    """Adapter -> its placement at `now` (epoch seconds), for every adapter of the server; and when to judge again
    because an old home's drain time ends then (None: nothing waits on time)."""
    largest = max((a.size_bytes for a in adapters), default=0)
    disk = placement.placed_budget(server.disk_bytes, on_demand_slots=server.on_demand_slots, largest=largest)
    replicas = [
        placement.Replica(name, disk_bytes=disk, max_adapters=server.max_adapters)
        for name in pod_names(server.name, server.replicas)
    ]
    copies = {a.name: server.copies for a in adapters}
    if server.auto:
        copies = placement.auto_copies(
            {a.name: a.load for a in adapters},
            current={a.name: a.current.copies for a in adapters if a.current is not None and a.current.copies},
            replicas=server.replicas,
            slots=server.slots,
            minimum=server.copies,
        )
    if server.one_or_all:
        copies = placement.one_or_all(copies, replicas=server.replicas)
    wanted = [placement.Adapter(a.name, size_bytes=a.size_bytes, replicas=a.copies or copies[a.name]) for a in adapters]
    # Each adapter's target homes so far (its draining ones are on their way out), which placement keeps where it can.
    current = {a.name: a.current.target or a.assigned for a in adapters if a.current is not None}
    if server.auto:
        # Homes follow where the router sends each adapter; a move under way ends (its new homes loaded, the drain
        # time passed) before the load may move that adapter again, else its new home, idle while it loads, would
        # lose to the old one.
        following = {a.name: a.pod_load for a in adapters if a.current is None or not a.current.draining}
        target = placement.follow_place(wanted, replicas, current, following)
    else:
        target = placement.place(wanted, replicas, current)
    result, recheck = {}, None
    for adapter in adapters:
        homes = list(target.homes[adapter.name])
        draining = [pod for pod in adapter.assigned if pod not in homes]
        # As placement.plan orders it: the old homes go only once every new home reports the adapter loaded (an
        # adapter no pod has room for keeps them), and then only after the drain time, so that clients and routers
        # reading this status have switched to the new homes and requests under way on the old ones have ended.
        # A home not yet in the assignment cannot have loaded it for this move: whatever its entry says is stale.
        if draining and homes and all(pod in adapter.loaded_on and pod in adapter.assigned for pod in homes):
            until = max(adapter.loaded_on[pod] for pod in homes) + server.drain_seconds
            if now >= until:
                draining = []
            else:
                recheck = until if recheck is None else min(recheck, until)
        result[adapter.name] = AdapterPlacement(
            replicas=homes + draining,
            target=homes,
            draining=draining,
            short=target.short.get(adapter.name, 0),
            copies=placement.clamp_count(adapter.copies or copies[adapter.name], server.replicas),
            load=round(adapter.load, 2) if server.auto else None,
        )
    return result, recheck


def pods_needed(assignments: Iterable[Sequence[str]], *, server: str) -> int:
    """Pods the StatefulSet must keep so every pod an assignment names exists: 1 + the highest ordinal named."""
    pattern = re.compile(re.escape(server) + r"-(\d+)")
    ordinals = [int(m.group(1)) for pods in assignments for pod in pods if (m := pattern.fullmatch(pod))]
    return max(ordinals, default=-1) + 1
