"""Compare all-on-all + round-robin with placement + adapter-affinity routing over a grid of fleets; print tables.

    PYTHONPATH=operator:image:kernels:benchmarks .venv/bin/python -m fleet.simulate [--plot docs/fleet-simulation.png]

For every (adapters, replicas) cell, one seeded request stream is served four times: today's layout, every adapter
on every replica, with each request to the next replica in turn or to a random one (a ClusterIP Service); and
`moelora.operator.placement` (copies per adapter from its request rate, a disk budget per replica) with each request
to the least-loaded replica holding its adapter, or to a holder that has it on the GPU already unless that one is
busier by more than a slack (the Gateway API Inference Extension endpoint picker's LoRA affinity). The scale event
re-places the same adapters on N+1 replicas with the same disk budget and counts what the make-before-break plan
loads.
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

from fleet.core import DISK, GPU, Costs, Replica, Router, Stats, affinity, random_spread, round_robin, run
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
    p.add_argument(
        "--copy-rate",
        type=float,
        default=0.0,
        help="req/s one copy should carry (default: rate-per-replica / max-cpu-loras)",
    )
    p.add_argument("--disk-slack", type=float, default=1.2, help="placement's disk budget / a replica's fair share")
    p.add_argument(
        "--affinity-slack",
        type=int,
        default=4,
        help="GPU-first picker: a holder with the adapter active may have this many more requests in flight",
    )
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
        copy_rate=args.copy_rate or args.rate_per_replica / args.max_cpu_loras,
    )
    adapters = [placement.Adapter(name, int(size * GB), counts[name]) for name, size in zip(names, sizes)]
    if budget is None:
        budget = int(args.disk_slack * sum(a.size_bytes * a.replicas for a in adapters) / replicas)
    fleet = [placement.Replica(f"ms-{index}", disk_bytes=budget) for index in range(replicas)]
    return placement.place(adapters, fleet), budget


LAYOUTS = {
    "all-on-all": "all-on-all, round-robin",
    "all-on-all-random": "all-on-all, random (kube-proxy iptables)",
    "placement": "placement, least-loaded holder",
    "placement-gpu-first": "placement, GPU-resident holder first",
}


def cells(args: argparse.Namespace, adapters: int, replicas: int) -> list[Cell]:
    """The four layouts of one (adapters, replicas) cell, on the same request stream."""
    shares = zipf_shares(adapters, args.zipf)
    sizes = adapter_sizes(args, adapters)
    stream = requests(shares, rate=args.rate_per_replica * replicas, count=args.requests, seed=args.seed)
    costs = Costs(h2d_gbps=args.h2d_gbps, disk_gbps=args.disk_gbps)
    s3_gbps = args.s3_mibps * 2**20 / GB
    index = lambda name: int(name.rsplit("-", 1)[1])  # noqa: E731

    def serve(router: Router) -> Stats:
        fleet = [Replica(args.max_loras, args.max_cpu_loras) for _ in range(replicas)]
        return run(stream, fleet, router, sizes, costs, service_s=args.service_s, warmup=int(args.warmup * len(stream)))

    total_gb = sum(sizes)
    everywhere = dict(disk_gb=total_gb, scale_gb=total_gb, scale_moved=0.0, new_pod_s=total_gb / s3_gbps)
    result = [
        Cell(adapters, replicas, "all-on-all", serve(round_robin()), **everywhere),
        Cell(adapters, replicas, "all-on-all-random", serve(random_spread(args.seed)), **everywhere),
    ]
    placed, budget = place(args, shares, sizes, replicas, None)
    holders = [[index(home) for home in placed.homes[f"adapter-{i}"]] for i in range(adapters)]
    if any(not found for found in holders):
        raise SystemExit(f"{adapters} adapters x {replicas} replicas: an adapter has no replica; raise --disk-slack")
    disk_gb = max(sum(sizes[index(name)] for name in names) for names in placed.held().values())
    scaled, _ = place(args, shares, sizes, replicas + 1, budget)
    moves = placement.plan(placed.homes, scaled.homes)
    newcomer_gb = sum(sizes[index(name)] for name, home in moves.loads if home == f"ms-{replicas}")
    common = dict(
        disk_gb=disk_gb,
        scale_gb=sum(sizes[index(name)] for name, _ in moves.loads),
        scale_moved=len({unload.adapter for unload in moves.unloads}) / adapters,
        new_pod_s=newcomer_gb / s3_gbps,
        short=sum(placed.short.values()),
    )
    result.append(Cell(adapters, replicas, "placement", serve(affinity(holders)), **common))
    gpu_first = affinity(holders, slack=args.affinity_slack)
    result.append(Cell(adapters, replicas, "placement-gpu-first", serve(gpu_first), **common))
    return result


HEADER = (
    "| adapters | replicas | layout + routing | GPU hit | CPU hit (of GPU misses) | disk loads | added TTFT p50 ms "
    "| p99 ms | mean ms | loader busy | disk per pod GB | scale N→N+1: GB loaded | adapters moved "
    "| new pod's downloads s |"
)


def row(cell: Cell) -> str:
    s = cell.stats
    routing = LAYOUTS[cell.strategy]
    return (
        f"| {cell.adapters} | {cell.replicas} | {routing} | {s.share(GPU):.1%} | {s.cpu_hit():.1%} | "
        f"{s.share(DISK):.1%} | {s.quantile(0.5) * 1e3:.0f} | {s.quantile(0.99) * 1e3:.0f} | "
        f"{sum(s.added) / max(1, s.requests) * 1e3:.0f} | {s.loader_busy(cell.replicas):.2f} | "
        f"{cell.disk_gb:.1f} | {cell.scale_gb:.1f} | "
        f"{cell.scale_moved:.1%} | {cell.new_pod_s:.0f} |"
    )


def verdicts(cell_list: list[Cell]) -> list[str]:
    """The issue's three targets, each placement layout against all-on-all with round-robin."""
    base = next(c for c in cell_list if c.strategy == "all-on-all")
    limit_moved = 1.2 / (base.replicas + 1)
    p99_a = base.stats.quantile(0.99)
    lines = ["| layout + routing | target | measured | result |", "|---|---|---|---|"]
    for b in (c for c in cell_list if c.strategy.startswith("placement")):
        p99_b, share = b.stats.quantile(0.99), base.disk_gb
        checks = [
            ("disk per pod ≤ 10% of all-on-all", f"{b.disk_gb:.1f} / {base.disk_gb:.1f} GB = {b.disk_gb / share:.1%}",
             b.disk_gb <= 0.1 * base.disk_gb),
            ("p99 added TTFT ≤ 1/5 of all-on-all round-robin's", f"{p99_b * 1e3:.0f} / {p99_a * 1e3:.0f} ms",
             p99_b <= p99_a / 5),
            (f"scale {b.replicas}→{b.replicas + 1} moves ≤ 1.2 × 1/{b.replicas + 1} = {limit_moved:.1%}",
             f"{b.scale_moved:.1%} of adapters", b.scale_moved <= limit_moved),
        ]  # fmt: skip
        lines += [
            f"| {LAYOUTS[b.strategy]} | {name} | {got} | {'pass' if ok else 'FAIL'} |" for name, got, ok in checks
        ]
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
        for color, replicas in enumerate(sorted({c.replicas for c in results})):
            for strategy, style in (("all-on-all", "--"), ("placement", "-"), ("placement-gpu-first", ":")):
                chosen = [c for c in results if c.replicas == replicas and c.strategy == strategy]
                xs, ys = [c.adapters for c in chosen], [value(c) for c in chosen]
                axis.plot(xs, ys, style, color=f"C{color}", marker="o", label=f"{LAYOUTS[strategy]}, {replicas}")
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
            layouts = cells(args, adapters, replicas)
            results.extend(layouts)
            for cell in layouts:
                print(row(cell), flush=True)
    short = [f"{c.adapters} x {c.replicas}: {c.short}" for c in results if c.short and c.strategy == "placement"]
    if short:
        print(f"\nExtra copies the disk budgets had no room for (adapters x replicas: copies): {'; '.join(short)}")
    target = [c for c in results if [c.adapters, c.replicas] == args.target]
    if target:
        print(f"\nTargets at {args.target[0]} adapters x {args.target[1]} replicas:\n")
        print("\n".join(verdicts(target)))
    if args.plot:
        plot(args.plot, results)
        print(f"\nplot: {args.plot}")
    print(f"\n{len(args.adapters) * len(args.replicas)} cells x {len(LAYOUTS)} layouts x {args.requests} requests "
          f"in {time.time() - started:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
