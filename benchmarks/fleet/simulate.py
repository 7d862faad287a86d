"""Compare adapter-blind routing, on-demand loads, all-on-all and placement over a grid of fleets; print a table.

    PYTHONPATH=operator:image:kernels:benchmarks .venv/bin/python -m fleet.simulate [--adapters 1000 --replicas 16]

For every (adapters, replicas) cell one seeded request stream is served six times, each by the Inference
Extension's endpoint picker (`fleet.core.picker`):
- adapter-blind: no adapter placed anywhere, every pod loading on demand what it is sent within placement's disk
  budget, routed by the queue and kv-cache scorers alone (what a picker that ignores adapters does);
- on demand only: the same, but routed by the full picker (queue, kv-cache, prefix, lora-affinity);
- all-on-all: every adapter on every pod's disk, routed by the full picker;
- placement: `moelora.operator.decide.placement`, each adapter warm on the pods the operator assigns it and loaded on
  demand anywhere else, routed by the same full picker;
- placement following load: the same, but every `--operator-s` seconds the operator re-places from each pod's load
  per adapter (`placement.follow_place`, what the operator runs for copiesMode Auto): copies go where the picker
  sends their adapter;
- routing to homes: what the operator does with routing.gateway.routeToHome: the copy rule's counts made one pod or
  all (`placement.one_or_all`), placed as placement does; the body-based router sends an adapter on one pod straight
  to it, and one on every pod through the picker (`fleet.core.homes`).
Copies come from the operator's own rule (`placement.auto_copies`) applied to per-adapter request counts over an
earlier window of the same workload, every request counted wherever it was served, as the operator sees load,
noise included. The scale event re-runs the rule and the placement on N+1 replicas with the same disk budget, from
the N-replica homes as the operator does, and counts every copy moved (`placement.moved`).
Where each default comes from is in its help text and in docs/fleet-simulation.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from fleet.core import FAILED, FETCH, Costs, Prompts, Replica, Router, Stats, homes, picker, run
from fleet.workload import requests, zipf_shares
from moelora.operator.decide import placement

GB = 1e9


@dataclass
class Cell:
    adapters: int
    replicas: int
    layout: str
    stats: Stats
    disk_gb: float  # the fullest pod's peak disk use
    evictions: int  # on-demand adapters evicted from disks for room
    copies: int  # copies held before the scale event
    added: int  # copies the scale event N -> N+1 adds
    removed: int  # and removes
    moved: int  # copies that change pod: per adapter the larger of the two
    replaced: int = 0  # copies the operator moved while serving (following load)
    downloaded: int = 0  # of which the pod had to download (not on its disk already)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda text: [int(part) for part in text.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapters", type=ints, default=[100, 1000])
    p.add_argument("--replicas", type=ints, default=[4, 16])
    p.add_argument("--requests", type=int, default=50_000, help="simulated requests per cell and layout")
    p.add_argument("--warmup", type=float, default=0.2, help="share of the requests that fill caches, not counted")
    p.add_argument("--window", type=int, default=5_000, help="requests in the earlier window copies are counted on")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent")
    p.add_argument("--adapter-gb", type=float, default=0.74, help="rank 32 on every expert of GPT-OSS-20B, bf16")
    p.add_argument("--max-loras", type=int, default=8, help="GPU adapter slots per replica (the H200 kit's)")
    p.add_argument("--max-cpu-loras", type=int, default=32, help="CPU adapter slots per replica")
    p.add_argument("--max-seqs", type=int, default=16, help="requests a replica runs at once (the kit's concurrency)")
    p.add_argument("--rate-per-replica", type=float, default=4.0, help="req/s: concurrency 16 over ~3.5 s each")
    p.add_argument("--service-s", type=float, default=3.5, help="request time: ~0.5 s TTFT + 600 tokens x ~5 ms")
    p.add_argument("--h2d-gbps", type=float, default=25.0, help="assumed: CPU -> GPU copy, ~40%% of PCIe 5 x16")
    p.add_argument("--disk-gbps", type=float, default=2.0, help="assumed: local NVMe read into CPU tensors")
    p.add_argument("--fetch-mibps", type=float, default=458.0, help="measured: agent download, s3rver on loopback")
    p.add_argument("--check-s-per-gb", type=float, default=0.91, help="measured: agent checks, cold, one core")
    p.add_argument("--disk-slack", type=float, default=1.2, help="placed copies' room / a replica's fair share")
    p.add_argument("--system-blocks", type=int, default=16, help="an adapter's shared system prompt, 64-char blocks")
    p.add_argument("--user-blocks", type=int, default=16, help="each request's own text, 64-char blocks")
    p.add_argument("--operator-s", type=float, default=60.0, help="seconds between the operator's re-placements")
    p.add_argument("--load-window-s", type=float, default=300.0, help="the agent's load window (its default)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def names(adapters: int) -> list[str]:
    return [f"adapter-{index}" for index in range(adapters)]


def observed_copies(args: argparse.Namespace, shares: np.ndarray, replicas: int, current=None) -> dict[str, int]:
    """The operator's copies rule on what it could observe: each adapter's requests over an earlier window."""
    window = requests(shares, rate=args.rate_per_replica * replicas, count=args.window, seed=args.seed + 7)
    seen = Counter(adapter for _, adapter in window)
    loads = {name: float(seen[index]) for index, name in enumerate(names(len(shares)))}
    return placement.auto_copies(loads, current=current or {}, replicas=replicas, slots=args.max_cpu_loras)


def place(
    sizes: list[float],
    copies: dict[str, int],
    replicas: int,
    budget: float | None,
    slack: float = 1.2,
    current: dict[str, tuple[str, ...]] | None = None,
    on_demand_slots: int = 8,
    pod_load: dict[str, dict[str, float]] | None = None,
):
    """The operator's placement on pods with `budget` GB of disk; without one, each pod gets `slack` x its fair
    share of the copies' GB plus the room the operator keeps for `on_demand_slots` (maxLoras) on-demand loads.
    With `pod_load` (adapter -> pod -> load), homes follow it as copiesMode Auto's do (`placement.follow_place`)."""
    adapters = [placement.Adapter(name, int(size * GB), copies[name]) for name, size in zip(names(len(sizes)), sizes)]
    largest = max((a.size_bytes for a in adapters), default=0)
    if budget is None:
        budget = (slack * sum(a.size_bytes * a.replicas for a in adapters) / replicas + on_demand_slots * largest) / GB
    disk = placement.placed_budget(int(budget * GB), on_demand_slots=on_demand_slots, largest=largest)
    fleet = [placement.Replica(f"ms-{index}", disk_bytes=disk) for index in range(replicas)]
    if pod_load is not None:
        return placement.follow_place(adapters, fleet, current or {}, pod_load), budget
    return placement.place(adapters, fleet, current), budget


def cells(args: argparse.Namespace, adapters: int, replicas: int) -> list[Cell]:
    """The layouts of one (adapters, replicas) cell, on the same request stream."""
    shares = zipf_shares(adapters, args.zipf)
    sizes = [args.adapter_gb] * adapters
    stream = requests(shares, rate=args.rate_per_replica * replicas, count=args.requests, seed=args.seed)
    costs = Costs(args.h2d_gbps, args.disk_gbps, args.fetch_mibps * 2**20 / GB, args.check_s_per_gb)
    prompts = Prompts(args.system_blocks, args.user_blocks)

    def serve(held: list[set[int]], budget: float, route: Router, follow=None) -> tuple[Stats, list[Replica]]:
        fleet = [
            Replica(
                args.max_loras,
                args.max_cpu_loras,
                sizes_gb=sizes,
                placed=h,
                disk_gb=budget,
                max_seqs=args.max_seqs,
                load_window_s=args.load_window_s,
            )
            for h in held
        ]
        operator = (lambda now: follow(now, fleet)) if follow else None
        warmup = int(args.warmup * len(stream))
        stats = run(stream, fleet, route, costs, service_s=args.service_s, warmup=warmup, operator=operator,
                    every_s=args.operator_s)  # fmt: skip
        return stats, fleet

    def cell(layout: str, stats: Stats, fleet: list[Replica], copies: int, added: int, removed: int, moved: int):
        peak, evicted = max(r.peak_gb for r in fleet), sum(r.evictions for r in fleet)
        return Cell(adapters, replicas, layout, stats, peak, evicted, copies, added, removed, moved)

    def scaled(layout: str, stats: Stats, fleet: list[Replica], before, after) -> Cell:
        """A layout with homes: its copies, and what the scale event N -> N+1 (homes before -> after) adds, removes
        and moves."""
        moves = placement.plan(before, after)
        copies_held = sum(map(len, before.values()))
        return cell(
            layout, stats, fleet, copies_held, len(moves.loads), len(moves.unloads), placement.moved(before, after)
        )

    copies = observed_copies(args, shares, replicas)
    placed, budget = place(sizes, copies, replicas, None, args.disk_slack, on_demand_slots=args.max_loras)
    index = lambda name: int(name.rsplit("-", 1)[1])  # noqa: E731

    def on_pods(homes) -> list[set[int]]:
        held: list[set[int]] = [set() for _ in range(replicas)]
        for name, pods in homes.items():
            for pod in pods:
                held[index(pod)].add(index(name))
        return held

    held = on_pods(placed.homes)
    result = []
    # Adapter-blind: nothing placed, the same disks as placement's pods, a picker with no adapter-aware scorer.
    stats, fleet = serve([set() for _ in range(replicas)], budget, picker(args.seed, prefix=0, lora=0, prompts=prompts))
    result.append(cell("adapter-blind", stats, fleet, 0, 0, 0, 0))
    # On demand only: nothing placed either, the same disks, but the full picker: what placed copies add to it.
    stats, fleet = serve([set() for _ in range(replicas)], budget, picker(args.seed, prompts=prompts))
    result.append(cell("on demand only", stats, fleet, 0, 0, 0, 0))
    everything = [set(range(adapters)) for _ in range(replicas)]
    stats, fleet = serve(everything, sum(sizes), picker(args.seed, prompts=prompts))
    result.append(cell("all-on-all", stats, fleet, adapters * replicas, adapters, 0, adapters))
    stats, fleet = serve(held, budget, picker(args.seed, prompts=prompts))
    grown = observed_copies(args, shares, replicas + 1, current=copies)
    grown_homes, _ = place(
        sizes, grown, replicas + 1, budget, current=dict(placed.homes), on_demand_slots=args.max_loras
    )
    result.append(scaled("placement", stats, fleet, placed.homes, grown_homes.homes))
    # Following load: from the same start, the operator re-places every --operator-s seconds from the pods' load.
    state = {"copies": copies, "homes": dict(placed.homes), "replaced": 0}

    def follow(now: float, fleet: list[Replica]) -> None:
        pod_load = pod_loads(fleet, now, adapters)
        totals = {name: sum(pods.values()) for name, pods in pod_load.items()}
        state["copies"] = placement.auto_copies(
            totals, current=state["copies"], replicas=replicas, slots=args.max_cpu_loras
        )
        new, _ = place(
            sizes, state["copies"], replicas, budget, current=state["homes"], on_demand_slots=args.max_loras,
            pod_load=pod_load,
        )  # fmt: skip
        state["replaced"] += placement.moved(state["homes"], new.homes)
        state["homes"] = dict(new.homes)
        for pod, adapters_there in zip(fleet, on_pods(new.homes)):
            pod.assign(adapters_there, now, costs)

    stats, fleet = serve(held, budget, picker(args.seed, prompts=prompts), follow)
    # The scale event from the homes reached, as the operator's next pass makes it: the copy-count rule on N+1 pods,
    # homes following the load as last read; the new pod gets the copies it now outranks an old home for, and then
    # what the picker sends it.
    pod_load = pod_loads(fleet, stream[-1][0], adapters)
    totals = {name: sum(pods.values()) for name, pods in pod_load.items()}
    grown = placement.auto_copies(totals, current=state["copies"], replicas=replicas + 1, slots=args.max_cpu_loras)
    grown_homes, _ = place(
        sizes, grown, replicas + 1, budget, current=state["homes"], on_demand_slots=args.max_loras, pod_load=pod_load
    )
    result.append(scaled("placement following load", stats, fleet, state["homes"], grown_homes.homes))
    result[-1].replaced, result[-1].downloaded = state["replaced"], sum(r.background for r in fleet)
    # Routing to homes: the copy rule's counts made one pod or all, as the operator makes them for routeToHome.
    one_or_all = placement.one_or_all(copies, replicas=replicas)
    homed, _ = place(sizes, one_or_all, replicas, budget, on_demand_slots=args.max_loras)
    home = {index(name): index(pods[0]) for name, pods in homed.homes.items() if len(pods) == 1}
    stats, fleet = serve(on_pods(homed.homes), budget, homes(args.seed, home=home, prompts=prompts))
    grown = placement.one_or_all(observed_copies(args, shares, replicas + 1, current=one_or_all), replicas=replicas + 1)
    grown_homed, _ = place(
        sizes, grown, replicas + 1, budget, current=dict(homed.homes), on_demand_slots=args.max_loras
    )
    result.append(scaled("routing to homes", stats, fleet, homed.homes, grown_homed.homes))
    return result


def pod_loads(fleet: list[Replica], now: float, adapters: int) -> dict[str, dict[str, float]]:
    """What the operator reads: adapter -> pod -> the agent's load there (assigned or on demand), for all adapters."""
    loads: dict[str, dict[str, float]] = {name: {} for name in names(adapters)}
    for index, replica in enumerate(fleet):
        for adapter in replica.heat:
            value = replica.load(adapter, now)
            if value > 0:
                loads[f"adapter-{adapter}"][f"ms-{index}"] = value
    return loads


HEADER = (
    "| adapters | replicas | layout | added TTFT p50 ms | p99 ms | failed | on-demand loads | evicted "
    "| disk per pod GB | copies | scale N→N+1: copies moved (share) | added + removed "
    "| moved while serving (downloaded) |"
)


def row(cell: Cell) -> str:
    s = cell.stats
    share = f"{cell.moved / cell.copies:.1%}" if cell.copies else "-"
    return (
        f"| {cell.adapters} | {cell.replicas} | {cell.layout} | {s.quantile(0.5) * 1e3:.0f} | "
        f"{s.quantile(0.99) * 1e3:.0f} | {s.tiers[FAILED]} | {s.tiers[FETCH]} ({s.share(FETCH):.1%}) | "
        f"{cell.evictions} | {cell.disk_gb:.1f} | {cell.copies} | {cell.moved} ({share}) | "
        f"{cell.added} + {cell.removed} | {cell.replaced} ({cell.downloaded}) |"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    started = time.time()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; {' '.join(sys.argv[1:]) or 'defaults'}\n")  # fmt: skip
    print(HEADER)
    print("|" + "---|" * HEADER.count("|", 1))
    for adapters in args.adapters:
        for replicas in args.replicas:
            for cell in cells(args, adapters, replicas):
                print(row(cell), flush=True)
    print(f"\n{len(args.adapters) * len(args.replicas)} cells x 6 layouts x {args.requests} requests "
          f"in {time.time() - started:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
