"""The simulator's core: one replica's adapter caches and loader, two routers, and the per-request loop.

A replica is modelled as vLLM keeps adapters: `gpu_slots` (maxLoras) active on the GPU and `cpu_slots`
(maxCpuLoras) in CPU memory, both least-recently-used; the GPU set stays inside the CPU set because vLLM drops an
adapter from the GPU when it leaves CPU memory. Every adapter routed to a replica is already on its disk (the agent
downloads what a replica holds ahead of time), so a request finds its adapter on the GPU (no load), in CPU memory
(copy to a GPU slot) or only on disk (read, then copy). vLLM loads adapters inside the engine step, one after
another, so a replica's loads queue behind each other: a load starts when the previous one has finished.

The loop is deterministic: requests in time order, each routed, then served; what it adds to a request's time to
first token is the wait until its adapter is ready on the GPU.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

GPU, CPU, DISK = "gpu", "cpu", "disk"


@dataclass(frozen=True)
class Costs:
    h2d_gbps: float  # CPU memory -> GPU slot copy
    disk_gbps: float  # adapter files on local disk -> CPU memory

    def load_seconds(self, tier: str, size_gb: float) -> float:
        if tier == GPU:
            return 0.0
        copy = size_gb / self.h2d_gbps
        return copy if tier == CPU else size_gb / self.disk_gbps + copy


class Replica:
    def __init__(self, gpu_slots: int, cpu_slots: int) -> None:
        self.gpu_slots, self.cpu_slots = gpu_slots, max(cpu_slots, gpu_slots)
        self.gpu: OrderedDict[int, float] = OrderedDict()  # adapter -> when it is ready on the GPU
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.loader_free = 0.0
        self.finishes: list[float] = []  # heap: when each in-flight request ends

    def in_flight(self, now: float) -> int:
        while self.finishes and self.finishes[0] <= now:
            heapq.heappop(self.finishes)
        return len(self.finishes)

    def serve(self, adapter: int, now: float, size_gb: float, costs: Costs) -> tuple[str, float]:
        """Make the adapter ready on the GPU; returns the tier it was found in and the seconds the request waits."""
        if adapter in self.gpu:
            self.gpu.move_to_end(adapter)
            self.cpu.move_to_end(adapter)
            return GPU, max(0.0, self.gpu[adapter] - now)
        tier = CPU if adapter in self.cpu else DISK
        ready = max(now, self.loader_free) + costs.load_seconds(tier, size_gb)
        self.loader_free = ready
        self.cpu[adapter] = None
        self.cpu.move_to_end(adapter)
        if len(self.cpu) > self.cpu_slots:
            evicted, _ = self.cpu.popitem(last=False)
            self.gpu.pop(evicted, None)
        self.gpu[adapter] = ready
        if len(self.gpu) > self.gpu_slots:
            self.gpu.popitem(last=False)
        return tier, ready - now


Router = Callable[[int, float, Sequence[Replica]], int]


def round_robin() -> Router:
    """What a ClusterIP Service does with every adapter on every replica: the next replica, whatever the adapter."""
    counter = itertools.count()
    return lambda adapter, now, replicas: next(counter) % len(replicas)


def random_spread(seed: int) -> Router:
    """What kube-proxy's default (iptables) mode does: a replica drawn at random for each connection."""
    rng = random.Random(seed)
    return lambda adapter, now, replicas: rng.randrange(len(replicas))


def affinity(holders: Sequence[Sequence[int]], slack: int | None = None) -> Router:
    """Only replicas holding the adapter, the one with the fewest requests in flight; ties go to the best-ranked.

    With `slack`, a holder that has the adapter on its GPU already is preferred while it has at most `slack` more
    requests in flight than the least-loaded holder, as the inference extension's picker prefers active adapters.
    """

    def pick(adapter: int, now: float, replicas: Sequence[Replica]) -> int:
        load = {index: replicas[index].in_flight(now) for index in holders[adapter]}
        least = min(load, key=load.__getitem__)
        if slack is not None:
            active = [index for index in load if adapter in replicas[index].gpu]
            if active:
                best = min(active, key=load.__getitem__)
                if load[best] <= load[least] + slack:
                    return best
        return least

    return pick


@dataclass
class Stats:
    tiers: dict[str, int] = field(default_factory=lambda: dict.fromkeys((GPU, CPU, DISK), 0))
    added: list[float] = field(default_factory=list)  # seconds added to each counted request's TTFT
    busy_s: float = 0.0  # the counted requests' loads, summed over replicas
    span_s: float = 0.0  # from the first counted request to the last

    @property
    def requests(self) -> int:
        return len(self.added)

    def share(self, tier: str) -> float:
        return self.tiers[tier] / self.requests if self.requests else 0.0

    def cpu_hit(self) -> float:
        """Of the requests that missed the GPU, the share found in CPU memory."""
        misses = self.tiers[CPU] + self.tiers[DISK]
        return self.tiers[CPU] / misses if misses else 1.0

    def loader_busy(self, replicas: int) -> float:
        """The share of time a replica's loader is loading; at 1 or more its queue grows for as long as the run."""
        return self.busy_s / (replicas * self.span_s) if self.span_s else 0.0

    def quantile(self, q: float) -> float:
        ordered = sorted(self.added)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(
    requests: Iterable[tuple[float, int]],
    replicas: Sequence[Replica],
    route: Router,
    sizes_gb: Sequence[float],
    costs: Costs,
    *,
    service_s: float,
    warmup: int = 0,
) -> Stats:
    """Serve requests (time, adapter) in time order; the first `warmup` requests fill caches and are not counted.

    A request occupies its replica (for least-loaded routing) from arrival until its adapter is ready plus
    `service_s`.
    """
    stats = Stats()
    first = now = 0.0
    for index, (now, adapter) in enumerate(requests):
        replica = replicas[route(adapter, now, replicas)]
        tier, wait = replica.serve(adapter, now, sizes_gb[adapter], costs)
        heapq.heappush(replica.finishes, now + wait + service_s)
        if index == warmup:
            first = now
        if index >= warmup:
            stats.tiers[tier] += 1
            stats.added.append(wait)
            stats.busy_s += costs.load_seconds(tier, sizes_gb[adapter])
    stats.span_s = now - first
    return stats
