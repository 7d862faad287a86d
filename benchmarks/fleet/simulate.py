"""Compare all-on-all + round-robin with placement + adapter-affinity routing over a grid of fleets; print tables.

    PYTHONPATH=operator:image:kernels:benchmarks .venv/bin/python -m fleet.simulate [--plot docs/fleet-simulation.png]

For every (adapters, replicas) cell, one seeded request stream is served twice: (a) today's layout, every adapter
on every replica and each request to the next replica in turn (a ClusterIP Service); (b) `moelora.operator.placement`
(copies per adapter from its request rate, a disk budget per replica) and each request to the least-loaded replica
holding its adapter (the Gateway API Inference Extension endpoint picker's LoRA affinity). The scale event re-places
the same adapters on N+1 replicas with the same disk budget and counts what the make-before-break plan loads.
Where each default comes from is in its help text and in docs/fleet-simulation.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np

from fleet.core import DISK, GPU, Costs, Replica, Stats, affinity, round_robin, run
from fleet.workload import requests, zipf_shares
from moelora.operator import placement

GB = 1e9


@dataclass
class Cell:
    adapters: int
    replicas: int
    strategy: str
    stats: Stats
    disk_gb: float  # the fullest pod's adapters
    scale_gb: float  # bytes loaded by the scale event N -> N+1
    scale_moved: float  # share of adapters whose copies moved (all-on-all: none move, the new pod downloads all)
    new_pod_s: float  # the new pod's downloads at the S3 rate
    short: int = 0  # copies the disk budgets could not take


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda text: [int(part) for part in text.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapters", type=ints, default=[100, 1000, 10000])
    p.add_argument("--replicas", type=ints, default=[4, 16, 64])
    p.add_argument("--requests", type=int, default=100_000, help="simulated requests per cell and strategy")
    p.add_argument("--warmup", type=float, default=0.2, help="share of the requests that fill caches, not counted")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent")
    p.add_argument("--adapter-gb", type=float, default=0.74, help="rank 32 on every expert of GPT-OSS-20B, bf16")
    p.add_argument("--size-spread", type=float, default=0.0, help="sizes uniform in adapter-gb x (1 +- spread)")
    p.add_argument("--max-loras", type=int, default=8, help="GPU adapter slots per replica (the H200 kit's)")
    p.add_argument("--max-cpu-loras", type=int, default=32, help="CPU adapter slots per replica")
    p.add_argument(
        "--rate-per-replica",
        type=float,
        default=4.0,
        help="requests/s per replica: the H200 kit's concurrency 16 over ~3.5 s per request (docs/benchmarks.md)",
    )
    p.add_argument(
        "--service-s", type=float, default=3.5, help="request time: ~0.5 s TTFT + 600 tokens x ~5 ms TPOT (measured)"
    )
    p.add_argument("--h2d-gbps", type=float, default=25.0, help="assumed: CPU -> GPU copy, ~40%% of PCIe 5 x16")
    p.add_argument("--disk-gbps", type=float, default=2.0, help="assumed: local NVMe read into CPU tensors")
    p.add_argument(
        "--s3-mibps", type=float, default=458.0, help="measured: agent download, s3rver on loopback (benchmarks.md)"
    )
    p.add_argument("--disk-slack", type=float, default=1.2, help="placement's disk budget / a replica's fair share")
    p.add_argument("--target", type=ints, default=[1000, 16], help="the (adapters, replicas) cell judged")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="", help="write the PNG here")
    return p.parse_args(argv)


def adapter_sizes(args: argparse.Namespace, count: int) -> list[float]:
    rng = np.random.default_rng(args.seed + 1)
    spread = rng.uniform(1 - args.size_spread, 1 + args.size_spread, size=count)
    return (args.adapter_gb * spread).tolist()


def place(args: argparse.Namespace, shares: np.ndarray, sizes: list[float], replicas: int, budget: int | None):
    """The placement for `replicas` replicas, with counts from the adapters' request rates."""
    rate = args.rate_per_replica * replicas
    names = [f"adapter-{index}" for index in range(len(shares))]
    counts = placement.replica_counts(
        {name: share * rate for name, share in zip(names, shares.tolist())},
        replicas=replicas,
        copy_rate=args.rate_per_replica / args.max_cpu_loras,
    )
    adapters = [placement.Adapter(name, int(size * GB), counts[name]) for name, size in zip(names, sizes)]
    if budget is None:
        budget = int(args.disk_slack * sum(a.size_bytes * a.replicas for a in adapters) / replicas)
    fleet = [placement.Replica(f"ms-{index}", disk_bytes=budget) for index in range(replicas)]
    return placement.place(adapters, fleet), budget


def cells(args: argparse.Namespace, adapters: int, replicas: int) -> tuple[Cell, Cell]:
    shares = zipf_shares(adapters, args.zipf)
    sizes = adapter_sizes(args, adapters)
    stream = requests(shares, rate=args.rate_per_replica * replicas, count=args.requests, seed=args.seed)
    costs = Costs(h2d_gbps=args.h2d_gbps, disk_gbps=args.disk_gbps)
    warmup = int(args.warmup * args.requests)
    new = lambda: [Replica(args.max_loras, args.max_cpu_loras) for _ in range(replicas)]  # noqa: E731
    s3_gbps = args.s3_mibps * 2**20 / GB

    everywhere = run(stream, new(), round_robin(), sizes, costs, service_s=args.service_s, warmup=warmup)
    total_gb = sum(sizes)
    a = Cell(adapters, replicas, "all-on-all", everywhere, total_gb, total_gb, 0.0, total_gb / s3_gbps)

    placed, budget = place(args, shares, sizes, replicas, None)
    holders = [[int(home.rsplit("-", 1)[1]) for home in placed.homes[f"adapter-{i}"]] for i in range(adapters)]
    if any(not found for found in holders):
        raise SystemExit(f"{adapters} adapters x {replicas} replicas: an adapter has no replica; raise --disk-slack")
    served = run(stream, new(), affinity(holders), sizes, costs, service_s=args.service_s, warmup=warmup)
    held = placed.held()
    disk_gb = max(sum(sizes[int(name.rsplit("-", 1)[1])] for name in names) for names in held.values())
    scaled, _ = place(args, shares, sizes, replicas + 1, budget)
    moves = placement.plan(placed.homes, scaled.homes)
    loaded_gb = sum(sizes[int(name.rsplit("-", 1)[1])] for name, _ in moves.loads)
    newcomer_gb = sum(sizes[int(name.rsplit("-", 1)[1])] for name, home in moves.loads if home == f"ms-{replicas}")
    moved = len({unload.adapter for unload in moves.unloads}) / adapters
    short = sum(placed.short.values())
    b = Cell(adapters, replicas, "placement", served, disk_gb, loaded_gb, moved, newcomer_gb / s3_gbps, short)
    return a, b


HEADER = (
    "| adapters | replicas | layout + routing | GPU hit | CPU hit (of GPU misses) | disk loads | added TTFT p50 ms "
    "| p99 ms | mean ms | loader busy | disk per pod GB | scale N→N+1: GB loaded | adapters moved "
    "| new pod's downloads s |"
)


def row(cell: Cell) -> str:
    s = cell.stats
    routing = "all-on-all, round-robin" if cell.strategy == "all-on-all" else "placement, affinity"
    return (
        f"| {cell.adapters} | {cell.replicas} | {routing} | {s.share(GPU):.1%} | {s.cpu_hit():.1%} | "
        f"{s.share(DISK):.1%} | {s.quantile(0.5) * 1e3:.0f} | {s.quantile(0.99) * 1e3:.0f} | "
        f"{sum(s.added) / max(1, s.requests) * 1e3:.0f} | {s.loader_busy(cell.replicas):.2f} | "
        f"{cell.disk_gb:.1f} | {cell.scale_gb:.1f} | "
        f"{cell.scale_moved:.1%} | {cell.new_pod_s:.0f} |"
    )


def verdicts(a: Cell, b: Cell) -> list[str]:
    limit_moved = 1.2 / (a.replicas + 1)
    p99_a, p99_b = a.stats.quantile(0.99), b.stats.quantile(0.99)
    checks = [
        ("disk per pod ≤ 10% of all-on-all", f"{b.disk_gb:.1f} / {a.disk_gb:.1f} GB = {b.disk_gb / a.disk_gb:.1%}",
         b.disk_gb <= 0.1 * a.disk_gb),
        ("p99 added TTFT ≤ 1/5 of all-on-all's", f"{p99_b * 1e3:.0f} / {p99_a * 1e3:.0f} ms",
         p99_b <= p99_a / 5),
        (f"scale {a.replicas}→{a.replicas + 1} moves ≤ 1.2 × 1/{a.replicas + 1} = {limit_moved:.1%}",
         f"{b.scale_moved:.1%} of adapters", b.scale_moved <= limit_moved),
    ]  # fmt: skip
    lines = ["| target | measured | result |", "|---|---|---|"]
    lines += [f"| {name} | {measured} | {'pass' if ok else 'FAIL'} |" for name, measured, ok in checks]
    return lines


def plot(path: str, results: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        ("p99 TTFT added by adapter loads (s)", lambda c: c.stats.quantile(0.99), "log"),
        ("GPU hit rate", lambda c: c.stats.share(GPU), "linear"),
        ("disk per pod (GB)", lambda c: c.disk_gb, "log"),
    ]
    for axis, (title, value, scale) in zip(axes, panels):
        for replicas in sorted({c.replicas for c in results}):
            for strategy, style in (("all-on-all", "--"), ("placement", "-")):
                chosen = [c for c in results if c.replicas == replicas and c.strategy == strategy]
                label = f"{strategy}, {replicas} replicas"
                axis.plot([c.adapters for c in chosen], [value(c) for c in chosen], style, marker="o", label=label)
        axis.set_xscale("log")
        axis.set_yscale(scale)
        axis.set_xlabel("adapters")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    started = time.time()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; {' '.join(sys.argv[1:]) or 'defaults'}\n")  # fmt: skip
    print(HEADER)
    print("|" + "---|" * HEADER.count("|", 1))
    results: list[Cell] = []
    for adapters in args.adapters:
        for replicas in args.replicas:
            pair = cells(args, adapters, replicas)
            results.extend(pair)
            for cell in pair:
                print(row(cell), flush=True)
            if pair[1].short:
                print(f"<!-- {pair[1].short} copies found no room -->")
    target = [c for c in results if [c.adapters, c.replicas] == args.target]
    if len(target) == 2:
        print(f"\nTargets at {args.target[0]} adapters x {args.target[1]} replicas:\n")
        print("\n".join(verdicts(*target)))
    if args.plot:
        plot(args.plot, results)
        print(f"\nplot: {args.plot}")
    print(f"\n{len(args.adapters) * len(args.replicas)} cells x 2 layouts x {args.requests} requests "
          f"in {time.time() - started:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
