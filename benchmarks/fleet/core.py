"""The simulator's core: one replica's disk and adapter caches, the endpoint picker, and the per-request loop.

A replica keeps adapters as the product's agent does. On disk: the adapters placement assigns it (warm, never
evicted by the loop), those it loaded on demand (held, registered in vLLM: `moelora.agent.serve.holding`), and
those the operator took away from it (unloaded from vLLM, their files left in the cache: `store.cache`), within a
disk budget. An adapter that needs room evicts unloaded files first, least recently asked first (`AdapterCache.evict`
never evicts what vLLM has loaded), then held ones, the least busy first and then the longest unasked
(`ondemand.coldest`); if placed ones alone leave no room the request fails (the agent answers vLLM's resolver 503
CacheFull, `ondemand.answer_for`). Unloaded files are not downloaded again when asked for, but checked again
(`Preparer` skips the download of a version already in the cache, never `validate`).
In vLLM: `gpu_slots` (maxLoras) active and `cpu_slots` (maxCpuLoras) in CPU memory, both LRU, the GPU set inside
the CPU set. A request for an adapter not on the replica's disk still answers there: vLLM's LoRA resolver asks the
pod's agent, which downloads and checks it (docs/architecture.md, on-demand holding), then vLLM loads it from disk.
vLLM loads adapters inside the engine step, one after another, so a replica's loads queue behind each other.

The router is the Gateway API Inference Extension's endpoint picker: it sees only what vLLM's metrics show (queue,
KV-cache use, adapters with running or waiting requests) and the prompt prefixes it sent to each pod itself, never
what is on a pod's disk, and filters nothing.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

GPU, CPU, DISK, FETCH, FAILED = "gpu", "cpu", "disk", "fetch", "failed"


@dataclass(frozen=True)
class Costs:
    h2d_gbps: float  # CPU memory -> GPU slot copy
    disk_gbps: float  # adapter files on local disk -> CPU memory
    fetch_gbps: float = math.inf  # the agent's download from object storage, for an adapter not on disk
    check_s_per_gb: float = 0.0  # the agent's tenant-safety checks of a downloaded adapter

    def load_seconds(self, tier: str, size_gb: float) -> float:
        """vLLM's part of making the adapter active: a copy from CPU memory, or a read from disk and the copy."""
        if tier == GPU:
            return 0.0
        copy = size_gb / self.h2d_gbps
        return copy if tier == CPU else size_gb / self.disk_gbps + copy

    def fetch_seconds(self, size_gb: float, *, cached: bool = False) -> float:
        """The agent's part of an on-demand load, before vLLM reads the adapter from disk; `cached`: its files are
        still in the cache, so only the checks run."""
        return (0.0 if cached else size_gb / self.fetch_gbps) + size_gb * self.check_s_per_gb


class Replica:
    def __init__(
        self,
        gpu_slots: int,
        cpu_slots: int,
        *,
        sizes_gb: Sequence[float],
        placed: Collection[int] = (),
        disk_gb: float = math.inf,
        max_seqs: int = 16,
        load_window_s: float = 300.0,
    ) -> None:
        self.gpu_slots, self.cpu_slots, self.max_seqs = gpu_slots, max(cpu_slots, gpu_slots), max_seqs
        self.sizes_gb, self.disk_gb, self.placed = sizes_gb, disk_gb, frozenset(placed)
        self.disk: OrderedDict[int, float] = OrderedDict((a, 0.0) for a in sorted(placed))  # -> when it is on disk
        self.used_gb = sum(sizes_gb[a] for a in placed)
        self.peak_gb = self.used_gb
        self.gpu: OrderedDict[int, float] = OrderedDict()  # adapter -> when it is ready on the GPU
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.loader_free = 0.0
        self.requests: list[tuple[float, float, int, float]] = []  # in flight: (start, end, adapter, enters vLLM)
        self.entered = 0.0  # when the request `serve` last made ready reaches vLLM's engine
        self.evictions = 0
        self.unloaded: set[int] = set()  # on disk, but the operator took it away: vLLM no longer has it
        self.background = 0  # assigned copies the agent downloaded off the request path
        # The agent's load per adapter (report/usage.py: a mean over about `load_window_s`), here a decayed count of
        # the requests sent for it: adapter -> (value, when).
        self.window_s = load_window_s
        self.heat: dict[int, tuple[float, float]] = {}

    def load(self, adapter: int, now: float) -> float:
        """Requests sent for the adapter per second, averaged over about the last `window_s` seconds."""
        value, when = self.heat.get(adapter, (0.0, now))
        return value * math.exp(-(now - when) / self.window_s) / self.window_s

    def metrics(self, now: float) -> tuple[int, float, set[int], set[int]]:
        """What vLLM's /metrics shows the picker: waiting requests, KV-cache use, and the adapters with running and
        with waiting requests (`vllm:lora_requests_info`); a request waits until its adapter is ready. A request
        whose adapter vLLM does not have yet shows nowhere while the agent fetches it: vLLM's API server awaits its
        LoRA resolver (`OpenAIServing._check_model`, vllm/entrypoints/openai) before the engine sees the request."""
        self.requests = [r for r in self.requests if r[1] > now]
        seen = [r for r in self.requests if r[3] <= now]
        running = {adapter for start, _, adapter, _ in seen if start <= now}
        waiting = {adapter for start, _, adapter, _ in seen if start > now}
        queued = sum(start > now for start, _, _, _ in seen)
        return queued, min(1.0, (len(seen) - queued) / self.max_seqs), running, waiting

    def _hold(self, adapter: int, ready: float, now: float) -> bool:
        """Make room for an adapter on disk by `ready`: unloaded files first, least recently asked first, then
        those held on demand, the least busy first, then the longest unasked; False: no room."""
        size = self.sizes_gb[adapter]
        if self.used_gb + size > self.disk_gb:
            unloaded = [a for a in self.disk if a in self.unloaded]
            held = [a for a in self.disk if a not in self.placed and a not in self.unloaded]
            order = {a: position for position, a in enumerate(self.disk)}
            cold = unloaded + sorted(held, key=lambda a: (self.load(a, now), order[a]))
            for victim in cold:
                if self.used_gb + size <= self.disk_gb:
                    break
                self._evict(victim)
        if self.used_gb + size > self.disk_gb:
            return False
        self.disk[adapter] = ready
        self.used_gb += size
        self.peak_gb = max(self.peak_gb, self.used_gb)
        return True

    def _evict(self, adapter: int) -> None:
        del self.disk[adapter]
        self.used_gb -= self.sizes_gb[adapter]
        self.unloaded.discard(adapter)
        self.cpu.pop(adapter, None)
        self.gpu.pop(adapter, None)
        self.evictions += 1

    def assign(self, placed: Collection[int], now: float, costs: Costs) -> None:
        """The operator's new assignment. A copy taken away is unloaded from vLLM, its files left in the cache; a
        new one the agent downloads (or, still in the cache, checks) in the background, making room as for any
        adapter; an adapter it held on demand simply becomes placed."""
        placed = frozenset(placed)
        for adapter in self.placed - placed:
            self.unloaded.add(adapter)
            self.cpu.pop(adapter, None)
            self.gpu.pop(adapter, None)
        self.placed = placed
        for adapter in sorted(placed):
            if adapter in self.unloaded:
                self.unloaded.discard(adapter)
                checked = now + costs.fetch_seconds(self.sizes_gb[adapter], cached=True)
                self.disk[adapter] = max(self.disk[adapter], checked)
            elif adapter not in self.disk:
                self._hold(adapter, now + costs.fetch_seconds(self.sizes_gb[adapter]), now)
                self.background += 1

    def serve(self, adapter: int, now: float, costs: Costs) -> tuple[str, float]:
        """Make the adapter ready on the GPU; returns where it was found and the seconds the request waits."""
        size = self.sizes_gb[adapter]
        value, when = self.heat.get(adapter, (0.0, now))
        self.heat[adapter] = (value * math.exp(-(now - when) / self.window_s) + 1.0, now)
        on_disk = self.disk.get(adapter)
        if on_disk is not None:
            self.disk.move_to_end(adapter)
        self.entered = now
        if adapter in self.gpu:
            self.gpu.move_to_end(adapter)
            self.cpu.move_to_end(adapter)
            return GPU, max(0.0, self.gpu[adapter] - now)
        if adapter in self.unloaded:  # asked again: the agent holds it on demand, checking the cached files
            self.unloaded.discard(adapter)
            tier, on_disk = FETCH, max(on_disk or now, now + costs.fetch_seconds(size, cached=True))
            self.disk[adapter] = on_disk
        elif on_disk is None:
            tier, on_disk = FETCH, now + costs.fetch_seconds(size)
            if not self._hold(adapter, on_disk, now):
                return FAILED, 0.0
        else:
            tier = CPU if adapter in self.cpu else DISK
        if tier != CPU:  # not registered in vLLM yet (fetched, or a placed copy still downloading): the resolver waits
            self.entered = max(now, on_disk)
        ready = max(now, self.loader_free, on_disk) + costs.load_seconds(CPU if tier == CPU else DISK, size)
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


@dataclass(frozen=True)
class Prompts:
    """Prompt shape in the prefix scorer's hash blocks (64 characters each): every request for an adapter starts
    with that adapter's system prompt, then text of its own."""

    system_blocks: int = 16  # ~1,000 characters shared by all of an adapter's requests
    user_blocks: int = 16  # ~1,000 characters no other request shares


def picker(
    seed: int,
    *,
    queue: float = 2.0,
    kv: float = 2.0,
    prefix: float = 3.0,
    lora: float = 1.0,
    prompts: Prompts = Prompts(),
    lru_blocks: int = 31_250,
) -> Router:
    """The endpoint picker: weighted scorers summed, the highest total wins, ties drawn at random.

    Scorers as upstream (kubernetes-sigs/gateway-api-inference-extension, pkg/epp/scheduling/framework/plugins/):
    queue (min-max of waiting requests), kv-cache utilization (1 - use), prefix-cache (multi/prefix/plugin.go: the
    share of the request's block hashes, the first of them the model name's, that the picker itself last sent to
    the pod, kept per pod in an LRU of `lru_blocks` entries, 31,250 by default) and lora-affinity (1.0 adapter
    active, 0.8 a free slot, 0.6 adapter waiting). Weights from the default profile of the InferencePool chart
    (config/charts/inferencepool/templates/epp-config.yaml: queue 2, kv-cache 2, prefix 3), which has no
    lora-affinity scorer: added here with a pluginRef's default weight, 1. A weight of 0 leaves a scorer out.
    """
    rng = random.Random(seed)
    blocks = 1 + prompts.system_blocks + prompts.user_blocks
    shared = 1 + prompts.system_blocks  # the model name's hash and the system prompt's blocks
    inserted: list[int] = []  # per pod: block hashes the picker has recorded for it so far
    last: list[dict[int, int]] = []  # per pod: adapter -> `inserted` just after its last request there

    def pick(adapter: int, now: float, replicas: Sequence[Replica]) -> int:
        while len(inserted) < len(replicas):
            inserted.append(0)
            last.append({})
        seen = [replica.metrics(now) for replica in replicas]
        least, most = min(m[0] for m in seen), max(m[0] for m in seen)
        totals = []
        for index, ((waiting, kv_use, running, queued), replica) in enumerate(zip(seen, replicas)):
            queue_score = 1.0 if most == least else (most - waiting) / (most - least)
            if adapter in running:
                affinity = 1.0
            elif len(running) + len(queued) < replica.gpu_slots:
                affinity = 0.8
            elif adapter in queued:
                affinity = 0.6
            else:
                affinity = 0.0
            # Its first hash (the model name's, the oldest of its last request's entries) is still in the pod's LRU
            # while that request's entries and those recorded since fit; without it nothing matches.
            when = last[index].get(adapter)
            cached = when is not None and inserted[index] - when <= lru_blocks - blocks
            total = queue * queue_score + kv * (1.0 - kv_use) + lora * affinity
            totals.append(total + (prefix * shared / blocks if cached else 0.0))
        best = max(totals)
        chosen = rng.choice([index for index, total in enumerate(totals) if total == best])
        inserted[chosen] += blocks  # the picker records the chosen pod's hashes as the request goes (PreRequest)
        last[chosen][adapter] = inserted[chosen]
        return chosen

    return pick


def homes(seed: int, *, home: Mapping[int, int], prompts: Prompts = Prompts()) -> Router:
    """Routing to homes (routing.gateway.routeToHome): the body-based router sends an adapter with a `home` (placed on
    that pod alone) straight to it, through the pod's own Service; any other through the server's pool, where the
    endpoint picker chooses among all pods."""
    everyone = picker(seed, prompts=prompts)

    def route(adapter: int, now: float, replicas: Sequence[Replica]) -> int:
        if adapter in home:
            return home[adapter]
        return everyone(adapter, now, replicas)

    return route


@dataclass
class Stats:
    tiers: dict[str, int] = field(default_factory=lambda: dict.fromkeys((GPU, CPU, DISK, FETCH, FAILED), 0))
    added: list[float] = field(default_factory=list)  # seconds added to each counted request's TTFT (served ones)

    @property
    def requests(self) -> int:
        return len(self.added) + self.tiers[FAILED]

    def share(self, tier: str) -> float:
        return self.tiers[tier] / self.requests if self.requests else 0.0

    def quantile(self, q: float) -> float:
        ordered = sorted(self.added)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(
    requests: Iterable[tuple[float, int]],
    replicas: Sequence[Replica],
    route: Router,
    costs: Costs,
    *,
    service_s: float,
    warmup: int = 0,
    operator: Callable[[float], None] | None = None,
    every_s: float = math.inf,
) -> Stats:
    """Serve requests (time, adapter) in time order; the first `warmup` requests fill caches and are not counted.

    A request is in flight on its replica from arrival until its adapter is ready plus `service_s`. `operator`, if
    given, is called with the time every `every_s` seconds, before the request that reaches it.
    """
    stats = Stats()
    due = every_s
    for index, (now, adapter) in enumerate(requests):
        if operator is not None and now >= due:
            operator(now)
            due = now + every_s
        replica = replicas[route(adapter, now, replicas)]
        tier, wait = replica.serve(adapter, now, costs)
        if tier != FAILED:
            replica.requests.append((now + wait, now + wait + service_s, adapter, replica.entered))
        if index >= warmup:
            stats.tiers[tier] += 1
            if tier != FAILED:
                stats.added.append(wait)
    return stats
