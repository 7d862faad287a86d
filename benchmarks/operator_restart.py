"""What one operator restart costs when both servers were recreated while it was down: seconds until the cluster is
consistent again, and the API requests the operator made meanwhile, by verb and resource.

    .venv/bin/python benchmarks/operator_restart.py [--runs 3] [--seed 5]

The emulated API server (counting requests by client) holds 2 ModelServers and 50 LoRAAdapters; the cluster around
the operator is chaos_cluster.World (ready pods, agents reporting every adapter, the garbage collector). The operator
(`python -m moelora.operator`) starts and settles; it is SIGKILLed; both servers are deleted and created again; one
second later it starts again, and chaos_cluster.violations is checked every 0.1 s until none is left (timed from
the start, as chaos_operator.py times its last one). Prints a Markdown table per run.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys
import tempfile
import time

from chaos_cluster import World, snapshot, violations
from chaos_operator import CRS, NS, SERVERS, Operator, populate, server_body

from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.apiserver.counting import CountingEmulator

OPERATOR = "openapi-generator"  # the operator's own requests (kopf's watches say `kopf`)


def settle(kube: KubeAPI, *, since: float, timeout: float) -> float | None:
    """Seconds from `since` (monotonic) until no violation is left; None if some are left `timeout` s after it."""
    while time.monotonic() - since < timeout:
        if not violations(snapshot(kube)):
            return time.monotonic() - since
        time.sleep(0.1)
    return None


def run(*, seed: int, timeout: float = 60.0) -> tuple[float | None, int, dict[str, int]]:
    """(seconds to consistent after the restart, violations at the restart, operator requests by kind)."""
    rng = random.Random(seed)
    kube = KubeAPI(namespace=NS)
    kube.emulator = counter = CountingEmulator()
    log = pathlib.Path(tempfile.mkdtemp(prefix="operator-restart-")) / "operator.log"
    with kube:
        populate(kube, rng)
        world = World(kube=kube)
        operator = Operator(kubeconfig=kube.kubeconfig, log=log)
        world.start()
        try:
            operator.start()
            if settle(kube, since=time.monotonic(), timeout=timeout) is None:
                raise RuntimeError(f"the first start never settled: see {log}")
            operator.kill()
            rest = Rest(url=kube.url)
            for name in SERVERS:
                rest.request(method="DELETE", path=f"{CRS}/modelservers/{name}")
            time.sleep(1.0)  # the cluster's actors answer (the collector, agents) meanwhile
            for name in SERVERS:
                rest.request(method="POST", path=f"{CRS}/modelservers", body=server_body(name, rng))
            time.sleep(1.0)
            at_restart = len(violations(snapshot(kube)))
            counter.reset()
            start = time.monotonic()
            operator.start()
            took = settle(kube, since=start, timeout=timeout)
            counted = counter.requests.items()
            requests = {f"{verb} {resource}": n for (client, verb, resource), n in counted if client == OPERATOR}
        finally:
            operator.stop()
            world.stop()
    return took, at_restart, requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    failed = 0
    for i in range(args.runs):
        took, at_restart, requests = run(seed=args.seed + i)
        failed += took is None
        top = sorted(requests.items(), key=lambda item: -item[1])[:6]
        print(f"\nrun {i + 1} (seed {args.seed + i})\n\n| measure | value |\n|---|---|")
        print(f"| violations at the restart | {at_restart} |")
        print(f"| restart to consistent | {'never' if took is None else f'{took:.1f} s'} |")
        print(f"| operator requests meanwhile | {sum(requests.values())} |")
        print(f"| of them, the most | {', '.join(f'{what} {n}' for what, n in top)} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
