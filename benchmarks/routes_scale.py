"""One gateway-routed, placed ModelServer with many adapters and routeToHome: how long the operator takes to write
every adapter's body-based router ConfigMap, then to send each home once its pod's agent reports it loaded.

    PYTHONPATH=operator:image:kernels:local .venv/bin/python benchmarks/routes_scale.py [--adapters 1000 --pods 16]

The API server is moelora.local.apiserver's emulator (kmock) in this process, serving the InferencePool and HTTPRoute
of their published CRDs; the operator runs as its own process, `python -m moelora.operator`, as in a cluster. No
agents or kubelet run: this process creates the pods ready and writes the status patch each agent sends once loaded.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from moelora.local.apiserver import KubeAPI, Rest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from operator_scale import operator_process  # noqa: E402

NS = "bench"
SERVER = "routed"
CONFIG_MAPS = "v1/configmaps"
LORA = "moelora.io/v1alpha1/loraadapters"


def server(pods: int) -> dict[str, Any]:
    gateway = {"enabled": True, "parentRefs": [{"name": "gw"}], "routeToHome": True}
    spec = {"model": {"name": "org/tiny-moe"}, "replicas": pods, "placement": {}, "routing": {"gateway": gateway}}
    return {"apiVersion": "moelora.io/v1alpha1", "kind": "ModelServer", "metadata": {"name": SERVER}, "spec": spec}


def adapter(name: str) -> dict[str, Any]:
    spec = {"modelServer": SERVER, "source": {"uri": f"s3://bucket/{name}/"}}
    return {"apiVersion": "moelora.io/v1alpha1", "kind": "LoRAAdapter", "metadata": {"name": name}, "spec": spec}


def routes(kube: KubeAPI) -> dict[str, str]:
    """Adapter -> the header value its ConfigMap maps it to."""
    return {
        cm["metadata"]["name"].removesuffix("-route"): cm["data"]["baseModel"]
        for cm in kube.list(CONFIG_MAPS, NS)
        if cm["metadata"]["name"].endswith("-route")
    }


def wait(check: Callable[[], bool], *, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.25)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    names = [f"adapter-{index:04d}" for index in range(args.adapters)]
    with KubeAPI(published=("InferencePool", "HTTPRoute")) as kube, operator_process(kube, resync_seconds=3600):
        rest = Rest(url=kube.url)
        path = f"/apis/moelora.io/v1alpha1/namespaces/{NS}"
        rest.request(method="POST", path=f"{path}/modelservers", body=server(args.pods))
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: rest.request(method="POST", path=f"{path}/loraadapters", body=adapter(n)), names))
        created = time.monotonic() - start
        mapped = wait(lambda: len(routes(kube)) == args.adapters, timeout=args.timeout, what="every ConfigMap")
        placed = {a["metadata"]["name"]: a["status"]["placement"]["target"] for a in kube.list(LORA, NS)}
        for ordinal in range(args.pods):
            pod = f"{SERVER}-{ordinal}"
            labels = {"app.kubernetes.io/managed-by": "moelora", "moelora.io/model-server": SERVER}
            body = {"metadata": {"name": pod, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
            rest.request(method="POST", path=f"/api/v1/namespaces/{NS}/pods", body=body)
            ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            rest.request(method="PATCH", path=f"/api/v1/namespaces/{NS}/pods/{pod}/status", body=ready)
        start = time.monotonic()

        def report(name: str) -> None:
            replicas = {pod: {"loaded": True, "state": "Loaded"} for pod in placed[name]}
            rest.request(
                method="PATCH", path=f"{path}/loraadapters/{name}/status", body={"status": {"replicas": replicas}}
            )

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(report, names))
        reported = time.monotonic() - start
        singles = {name for name, pods in placed.items() if len(pods) == 1}
        want = {name: f"{SERVER}@{placed[name][0]}" if name in singles else SERVER for name in names}
        homed = wait(lambda: routes(kube) == want, timeout=args.timeout, what="every route home") + reported
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} CPUs")
    print(
        "| adapters | pods | adapters created in | every ConfigMap written after | reports written in "
        "| every route home after the first report |"
    )
    print("|---|---|---|---|---|---|")
    print(f"| {args.adapters} | {args.pods} | {created:.1f} s | {mapped:.1f} s | {reported:.1f} s | {homed:.1f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
