"""Which replicas of a ModelServer hold which adapters: pure functions of names, sizes, counts and capacities.

Each adapter lives on a few of its server's replicas instead of all of them. The replicas are chosen by weighted
rendezvous (highest-random-weight) hashing: every (adapter, replica) pair gets a score that depends only on the two
names and the replica's weight, and an adapter's copies go to its best-scoring replicas that have room.

Stable replica identities are what make this cheap to change. The score of a pair never depends on the other
replicas, so adding `<ms>-N` to `<ms>-0 .. <ms>-(N-1)` moves only the copies for which the new replica now outranks
one of the old homes (about 1/(N+1) of them), and those copies move to the new replica, never between old ones.
That holds only if a replica keeps its name for life: StatefulSet ordinals (`<ms>-0`, `<ms>-1`, ...) survive
restarts and rescheduling, whereas a Deployment's random pod names would make every restarted pod a stranger and
reshuffle its share of adapters (a full re-download of each) on every rollout.

Capacity: a replica holds adapters up to its disk budget and up to a count (a multiple of vLLM's CPU slots).
Copies are placed in rounds (every adapter's first copy, then every second copy, ...) so that when the fleet is
short of room, extra copies are dropped before any adapter's only copy; within a round adapters go in an order
fixed by a hash of their names. A copy whose best-ranked replica
is full spills to the next-ranked one with room; a copy no replica can take is reported in `Placement.short`.

History matters only through capacity. Given the homes adapters have now, every copy stays where it is (placed
before any other copy of its round) except one that a replica holding nothing yet now outranks among the adapter's
first choices, which goes to that new replica as rendezvous would move it. With room everywhere this is plain
rendezvous. With full replicas, rendezvous from names alone would also move every copy that had spilled past a
full first choice back to it once a scale-out freed room there, a cascade of moves between old replicas; kept,
a scale-out of a full fleet moves about 1/(N+1) of the copies, all to the new replica.

Homes can also follow the load (`follow_place`, copiesMode Auto): the pods the router sends an adapter to become
its homes, and `place` keeps them as it keeps any current home.

Moves are make-before-break (`plan`): every new copy loads first, and an adapter's old copies are unloaded only
after all of its new copies report loaded. Known limit: a replica that gains and loses adapters in the same plan
holds both sets until the unloads run, so its disk budget needs room for that transient.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

_SCALE = float(2**64)


@dataclass(frozen=True)
class Replica:
    """One replica of a ModelServer, by its stable name (a StatefulSet ordinal such as `<ms>-0`)."""

    name: str
    disk_bytes: int | None = None  # None: no disk budget
    max_adapters: int | None = None  # None: no limit on the count
    weight: float = 1.0  # relative share of adapters it should attract, e.g. for larger disks


@dataclass(frozen=True)
class Adapter:
    name: str
    size_bytes: int
    replicas: int = 1  # copies wanted; `place` clamps it to [1, number of replicas]


@dataclass(frozen=True)
class Placement:
    homes: Mapping[str, tuple[str, ...]]  # adapter -> its replicas, best-ranked first
    short: Mapping[str, int] = field(default_factory=dict)  # adapter -> copies wanted that no replica had room for

    def held(self) -> dict[str, set[str]]:
        """Replica -> the adapters it holds (only replicas holding at least one)."""
        by_replica: dict[str, set[str]] = {}
        for adapter, replicas in self.homes.items():
            for replica in replicas:
                by_replica.setdefault(replica, set()).add(adapter)
        return by_replica


def _unit(*parts: str) -> float:
    """A uniform number in (0, 1) from the names; blake2b, not `hash()`, so every process agrees."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / _SCALE


def score(adapter: str, replica: Replica) -> float:
    """The pair's rendezvous score; -w/ln(u) makes a replica of weight w win in proportion to w."""
    return -replica.weight / math.log(_unit(adapter, replica.name))


def ranking(adapter: str, replicas: Sequence[Replica]) -> list[Replica]:
    """The replicas in the adapter's order of preference (ties, practically impossible, broken by name)."""
    return sorted(replicas, key=lambda replica: (-score(adapter, replica), replica.name))


def clamp_count(count: int, replicas: int) -> int:
    return max(1, min(count, replicas))


def one_or_all(copies: Mapping[str, int], *, replicas: int) -> dict[str, int]:
    """Copies for routing to homes: every replica for an adapter whose count reaches them, else one. An adapter
    on one pod can have its requests sent straight there; one on a few pods could only be sent to all of them, where
    the pods not holding it would load it on demand."""
    return {adapter: replicas if count >= replicas else 1 for adapter, count in copies.items()}


def placed_budget(disk_bytes: int | None, *, on_demand_slots: int, largest: int) -> int | None:
    """The part of a pod's disk budget its placed copies may fill. The rest is room for `on_demand_slots` adapters
    of the `largest` size loaded on demand (vLLM's maxLoras: as many as it serves at once), so that a request sent
    to a pod not holding its adapter never finds the disk full of placed ones (the agent would answer 503)."""
    if disk_bytes is None:
        return None
    return max(0, disk_bytes - on_demand_slots * largest)


def replica_counts(
    rates: Mapping[str, float],
    *,
    replicas: int,
    copy_rate: float,
    explicit: Mapping[str, int] | None = None,
    minimum: int = 1,
) -> dict[str, int]:
    """Copies per adapter: the explicit count where one is given, else enough copies that each carries at most
    `copy_rate` requests/s of the adapter's observed rate (at least `minimum`); all clamped to [1, replicas].

    A sensible `copy_rate` is a replica's request rate divided by its `maxCpuLoras`: a replica keeps that many
    adapters warm, so an adapter that alone needs more than one warm slot's share of a replica gets more replicas.
    The result depends on the number of replicas only through the clamp, so scaling out does not reshuffle counts.
    """
    explicit = explicit or {}
    counts = {}
    for adapter, rate in rates.items():
        wanted = explicit.get(adapter)
        if wanted is None:
            wanted = max(minimum, math.ceil(rate / copy_rate)) if copy_rate > 0 else minimum
        counts[adapter] = clamp_count(wanted, replicas)
    return counts


def auto_copies(
    loads: Mapping[str, float],
    *,
    current: Mapping[str, int],
    replicas: int,
    slots: int,
    minimum: int = 1,
    keep_margin: float = 1.5,
) -> dict[str, int]:
    """Copies per adapter from its share of the observed load (requests in flight, any unit): an adapter gets a
    copy for every warm slot's share of the fleet's load, `ceil(share x replicas x slots)`, clamped to
    [minimum, replicas]. `loads` must count every request for the adapter, those that pods not holding it served on
    demand too: those requests are load the adapter's copies should carry.

    Hysteresis against flapping: more copies are taken at once, but a copy is given back only when the adapter
    would need fewer copies even with `keep_margin` times its load, and then only down to that count. `current`:
    the copies decided last time (absent: none yet, the rule's count is taken as it is).
    """
    total = sum(loads.values())
    counts = {}
    for adapter, load in loads.items():
        share = load / total if total > 0 else 0.0
        wanted = clamp_count(max(minimum, math.ceil(share * replicas * slots)), replicas)
        before = current.get(adapter)
        if before is not None and wanted < before:
            kept = clamp_count(max(minimum, math.ceil(share * keep_margin * replicas * slots)), replicas)
            wanted = kept if kept < before else min(before, replicas)
        counts[adapter] = wanted
    return counts


def follow(
    pod_load: Mapping[str, Mapping[str, float]],
    current: Mapping[str, Sequence[str]],
    copies: Mapping[str, int],
    *,
    keep_margin: float = 1.5,
) -> dict[str, tuple[str, ...]]:
    """Homes that follow where the router sends each adapter (`pod_load`: adapter -> pod -> requests in flight
    there, assigned or on demand, as `status.replicas.<pod>.load` and `status.onDemandLoad` report it): a copy on
    each pod carrying its load, busiest first, at most `copies` (the most it may have); an adapter no pod carries
    load for keeps its current homes. Give each adapter `len(homes)` copies (at least 1) and these as `place`'s
    `current`, so that placement keeps them where the disks have room.

    The Inference Extension's picker never sees what is on a pod's disk; its prefix scorer keeps sending an adapter
    to the pods it sent it to before, which load it on demand. A copy there serves from disk instead of a download;
    a copy anywhere else holds disk those pods need for what the picker does send them. Against flapping a current
    home counts `keep_margin` times its load, so with more loaded pods than copies a copy moves only to a pod
    carrying clearly more. Ties go to current homes, then by pod name.
    """
    homes: dict[str, tuple[str, ...]] = {}
    for adapter in sorted(set(current) | set(pod_load)):
        now = set(current.get(adapter, ()))
        loads = {pod: load for pod, load in pod_load.get(adapter, {}).items() if load > 0}
        if not loads:
            homes[adapter] = tuple(current.get(adapter, ()))
            continue
        weight = {pod: load * (keep_margin if pod in now else 1.0) for pod, load in loads.items()}
        ranked = sorted(weight, key=lambda pod: (-weight[pod], pod not in now, pod))
        homes[adapter] = tuple(ranked[: max(1, copies.get(adapter, len(ranked)))])
    return homes


def place(
    adapters: Sequence[Adapter], replicas: Sequence[Replica], current: Mapping[str, Sequence[str]] | None = None
) -> Placement:
    """Assign each adapter its copies: best-ranked replicas first, spilling past replicas without room.

    `current`: the homes each adapter has now (adapter -> replica names, e.g. an earlier `Placement.homes`); names
    of replicas not in `replicas` are ignored. Without it the result depends only on names, sizes and capacities.
    """
    current = current or {}
    if not replicas:
        return Placement(homes={adapter.name: () for adapter in adapters}, short={})
    used = {replica.name: 0 for replica in replicas}
    held = {replica.name: 0 for replica in replicas}
    wanted = {adapter.name: clamp_count(adapter.replicas, len(replicas)) for adapter in adapters}
    prefs = {adapter.name: ranking(adapter.name, replicas) for adapter in adapters}
    # A current home stays unless a replica holding nothing yet now outranks it among the adapter's first choices:
    # the new replica's fair share comes from those copies alone, never from copies that spilled past a full one.
    old = {replica for homes in current.values() for replica in homes}
    kept: dict[str, list[Replica]] = {}
    for adapter in adapters:
        now = set(current.get(adapter.name, ()))
        pref = prefs[adapter.name]
        first = {replica.name for replica in pref[: wanted[adapter.name]]}
        displaced = {r.name for r in [r for r in pref if r.name in old][: wanted[adapter.name]]} - first
        kept[adapter.name] = [r for r in pref if r.name in now and r.name not in displaced][: wanted[adapter.name]]
    cursor = dict.fromkeys(wanted, 0)  # a replica passed over as full stays full, so each list is walked once
    homes: dict[str, list[str]] = {adapter.name: [] for adapter in adapters}
    short: dict[str, int] = {}
    order = sorted(adapters, key=lambda adapter: (_unit(adapter.name), adapter.name))

    def take(adapter: Adapter, replica: Replica) -> bool:
        fits_disk = replica.disk_bytes is None or used[replica.name] + adapter.size_bytes <= replica.disk_bytes
        fits_count = replica.max_adapters is None or held[replica.name] < replica.max_adapters
        if fits_disk and fits_count and replica.name not in homes[adapter.name]:
            used[replica.name] += adapter.size_bytes
            held[replica.name] += 1
            homes[adapter.name].append(replica.name)
            return True
        return False

    for copy in range(max(wanted.values(), default=0)):
        for adapter in order:
            if copy < len(kept[adapter.name]):
                take(adapter, kept[adapter.name][copy])
        for adapter in order:
            name = adapter.name
            if wanted[name] <= copy or len(homes[name]) > copy or name in short:
                continue
            pref = prefs[name]
            while cursor[name] < len(pref):
                replica = pref[cursor[name]]
                cursor[name] += 1
                if take(adapter, replica):
                    break
            else:
                short[name] = wanted[name] - len(homes[name])
    return Placement(
        homes={name: tuple(r.name for r in prefs[name] if r.name in found) for name, found in homes.items()},
        short=short,
    )


def follow_place(
    adapters: Sequence[Adapter],
    replicas: Sequence[Replica],
    current: Mapping[str, Sequence[str]],
    pod_load: Mapping[str, Mapping[str, float]],
    *,
    keep_margin: float = 1.5,
) -> Placement:
    """`place` from homes that follow the load: each adapter's pods carrying its load (`follow`, adapter -> pod ->
    requests in flight there, assigned or on demand), then its current homes the load does not reach, up to its
    copies (`Adapter.replicas`; how many stays the copy-count rule's, only where they are follows the load).

    Where each adapter's load is on its current homes only (or it has none) and it has no more homes than copies,
    this is `place(adapters, replicas, current)` exactly: a scale-out moves no more than placement alone. Load on
    pods not in `replicas` (a pod scaled away that still reports) is ignored, so it never pushes out a home that
    exists.
    """
    names = {replica.name for replica in replicas}
    copies = {adapter.name: clamp_count(adapter.replicas, len(replicas)) for adapter in adapters}
    here = {name: [pod for pod in current.get(name, ()) if pod in names] for name in copies}
    loads = {name: {pod: load for pod, load in pod_load.get(name, {}).items() if pod in names} for name in copies}
    followed = follow(loads, here, copies, keep_margin=keep_margin)
    start = {}
    for name, wanted in copies.items():
        homes = list(followed.get(name, ()))
        homes += [pod for pod in here[name] if pod not in homes]
        start[name] = tuple(homes[:wanted])
    return place(adapters, replicas, start)


def moved(old: Mapping[str, Sequence[str]], new: Mapping[str, Sequence[str]]) -> int:
    """Copies that change replica from `old` homes to `new`: per adapter the larger of the copies added and those
    removed, so a copy that goes from one replica to another counts once, as does a copy added or given back."""
    total = 0
    for adapter in set(old) | set(new):
        before, after = set(old.get(adapter, ())), set(new.get(adapter, ()))
        total += max(len(after - before), len(before - after))
    return total


@dataclass(frozen=True)
class Unload:
    adapter: str
    replica: str
    after: frozenset[str]  # replicas whose load of this adapter must report loaded first (empty: at once)


@dataclass(frozen=True)
class Plan:
    loads: tuple[tuple[str, str], ...]  # (adapter, replica) pairs to load now
    unloads: tuple[Unload, ...]

    def ready(self, loaded: Collection[tuple[str, str]]) -> tuple[Unload, ...]:
        """The unloads that may run now, given the (adapter, replica) pairs that report loaded."""
        return tuple(
            unload for unload in self.unloads if all((unload.adapter, replica) in loaded for replica in unload.after)
        )


def plan(old: Mapping[str, Sequence[str]], new: Mapping[str, Sequence[str]]) -> Plan:
    """Make-before-break moves from the old homes to the new (adapter -> replicas, e.g. `Placement.homes`).

    Every copy in `new` but not in `old` loads first. A copy in `old` but not in `new` unloads after all of its
    adapter's new copies report loaded, so an adapter keeps serving from its old homes until the new ones can; an
    adapter absent from `new` (deleted) has nothing to wait for.
    """
    loads: list[tuple[str, str]] = []
    unloads: list[Unload] = []
    for adapter in sorted(set(old) | set(new)):
        before, after = set(old.get(adapter, ())), set(new.get(adapter, ()))
        gained = frozenset(after - before)
        loads.extend((adapter, replica) for replica in sorted(gained))
        unloads.extend(Unload(adapter, replica, gained) for replica in sorted(before - after))
    return Plan(loads=tuple(loads), unloads=tuple(unloads))
