"""200 ModelServers applied at once against the emulated API server: time from create to Deployment, operator RSS.
With --adapters: one server's adapters in a cluster of unrelated pods, what the operator and an agent cost
(benchmarks/cluster_costs.py).

    .venv/bin/python benchmarks/operator_scale.py [--servers 200] [--workers 16]
    .venv/bin/python benchmarks/operator_scale.py --adapters 1000 --unrelated-pods 10000 [--other-adapters 1000]

The API server is moelora.local.apiserver's emulator (kmock) in this process; the operator runs as its own process,
`python -m moelora.operator`, exactly as in a cluster, so its peak RSS (VmHWM) is its own. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import kmock

from moelora.local.apiserver import KubeAPI

DEPLOYMENTS = "apps/v1/deployments"
MS = "moelora.io/v1alpha1/modelservers"


def model_server(index: int) -> dict[str, object]:
    return {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": f"bench-{index:04d}", "namespace": "bench"},
        "spec": {"model": {"name": "org/tiny-moe"}, "engineArgs": ["--max-model-len=4096"]},
    }


def post(url: str, obj: dict[str, object]) -> float:
    request = urllib.request.Request(
        f"{url}/apis/moelora.io/v1alpha1/namespaces/bench/modelservers",
        data=json.dumps(obj).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return time.monotonic()


def deployment_names(kube: KubeAPI) -> list[str]:
    """Names only, read in the emulator's loop without copying objects (the poll must not slow the server)."""
    wanted = kmock.resource(DEPLOYMENTS)
    return kube.call(
        lambda: [
            name
            for (res, ns, name), obj in kube.emulator.objects.items()
            if res == wanted and ns == "bench" and not obj.deleted
        ]
    )


@contextlib.contextmanager
def operator_process(kube: KubeAPI, *, resync_seconds: int) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m moelora.operator` against `kube`, as in a cluster, given kopf's start-up, stopped on exit; the
    ERROR lines of its log are counted on stderr."""
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "MOELORA_RESYNC_SECONDS": str(resync_seconds)}
    log = tempfile.NamedTemporaryFile(prefix="operator-", suffix=".log", delete=False)  # noqa: SIM115
    operator = subprocess.Popen(
        [sys.executable, "-m", "moelora.operator"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        time.sleep(3)  # kopf's startup: discovery, watches
        if operator.poll() is not None:
            raise SystemExit(f"operator exited: {pathlib.Path(log.name).read_text()[-2000:]}")
        yield operator
    finally:
        from cluster_costs import stop_operator

        errors = stop_operator(operator, pathlib.Path(log.name))
        print(f"operator log: {log.name} ({len(errors)} ERROR lines)", file=sys.stderr)


def peak_rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=200)
    parser.add_argument("--workers", type=int, default=16, help="concurrent clients creating the servers")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--adapters", type=int, default=0, help="one server with this many adapters instead")
    parser.add_argument("--unrelated-pods", type=int, default=10000)
    parser.add_argument("--other-adapters", type=int, default=1000, help="adapters of another server")
    args = parser.parse_args()
    if args.adapters:
        return adapters_table(args)

    with KubeAPI(validate=True) as kube, operator_process(kube, resync_seconds=300) as operator:
        idle_rss = peak_rss_mib(operator.pid)
        objects = [model_server(i) for i in range(args.servers)]
        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            futures = {pool.submit(post, kube.url, obj): obj["metadata"]["name"] for obj in objects}  # type: ignore[index]
            while len(seen) < args.servers and time.monotonic() - start < args.timeout:
                for future in [f for f in futures if f.done() and futures[f] not in created]:
                    created[futures[future]] = future.result()
                now = time.monotonic()
                for name in deployment_names(kube):
                    seen.setdefault(name, now)
                time.sleep(0.05)
            for future, name in futures.items():
                created.setdefault(name, future.result())
        all_deployments = time.monotonic() - start
        while time.monotonic() - start < args.timeout:  # every server's status written
            statuses = [s for s in kube.list(MS, "bench") if (s.get("status") or {}).get("conditions")]
            if len(statuses) == args.servers:
                break
            time.sleep(0.5)
        all_status = time.monotonic() - start
        time.sleep(2)
        peak_rss = peak_rss_mib(operator.pid)

    missing = args.servers - len(seen)
    latencies = [seen[name] - created[name] for name in seen]
    print(
        "| servers | p50 create→Deployment | p95 | max | all Deployments | all statuses | operator peak RSS "
        "| operator RSS idle |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.servers}{f' ({missing} missing)' if missing else ''} | {statistics.median(latencies):.2f} s "
        f"| {percentile(latencies, 0.95):.2f} s | {max(latencies):.2f} s | {all_deployments:.1f} s "
        f"| {all_status:.1f} s | {peak_rss:.0f} MiB | {idle_rss:.0f} MiB |"
    )
    print(
        f"\n{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{args.workers} concurrent creating clients"
    )
    return 1 if missing else 0


def adapters_table(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from cluster_costs import Costs, measure

    costs = measure(
        Costs(adapters=args.adapters, unrelated_pods=args.unrelated_pods, other_adapters=args.other_adapters)
    )
    rows = [
        ("adapters on the server / of another server", f"{costs.adapters} / {costs.other_adapters}"),
        ("unrelated pods (+1 Deployment)", f"{costs.unrelated_pods}"),
        ("operator start → all adapters rolled up", f"{costs.startup_s:.1f} s"),
        ("pods / Deployments in the operator's lists", f"{costs.pods_listed} / {costs.deployments_listed}"),
        (
            "operator pod watch events (server's pod events; unrelated pod writes)",
            f"{costs.pod_watch_events} ({costs.server_pod_events}; {costs.unrelated_pod_events})",
        ),
        ("operator API calls per server pod event", f"{costs.calls_per_pod_event:.2f}"),
        (
            "agent watch events, both agents reporting each adapter in 2 states (bound 2 x adapters x states)",
            f"{costs.agent_watch_events} ({costs.agent_bound})",
        ),
        ("agents' reports → all Loaded and Current", f"{costs.settle_s:.1f} s"),
        ("operator peak RSS (VmHWM)", f"{costs.peak_rss_mib:.0f} MiB"),
        ("ERROR lines in the operator's log", f"{len(costs.errors)}"),
    ]
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(f"\n{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
