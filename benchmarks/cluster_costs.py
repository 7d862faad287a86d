"""What one server with many adapters in a big cluster costs: the operator (its own process) and one agent's watch.

`measure()` fills the emulated API server (a CountingEmulator) with unrelated pods and Deployments, one ModelServer
with its adapters, adapters of another server, and one ready pod of the server; starts `python -m moelora.operator`
against it and the agent's real AdapterWatcher in this process; then counts:
- the operator's watch events of pods and Deployments (only the server's own may arrive);
- the operator's API calls per pod event of the server (pods coming, changing without a readiness change, going);
- the agent's watch events while both servers' agents report every adapter Downloading, then Loaded (the agents'
  writes are played by this process: the same status patches the agent sends);
- the operator's peak RSS (VmHWM).
benchmarks/operator_scale.py --adapters N prints them; tests/operator/test_cluster_costs.py asserts them, smaller.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import kubernetes.config

from moelora.agent.report.kube import AdapterWatcher, Kube
from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.apiserver.counting import CountingEmulator

NS = "bench"
SERVER, OTHER = "srv", "srv-other"
LABELS = {"app.kubernetes.io/managed-by": "moelora", "moelora.io/model-server": SERVER}
OPERATOR_CLIENT = (
    "openapi-generator"  # the operator's handlers; kopf's watches say "kopf", this process "python-urllib"
)
AGENT_STATES = ("Downloading", "Loaded")


@dataclasses.dataclass
class Costs:
    adapters: int
    unrelated_pods: int
    other_adapters: int
    startup_s: float = 0.0  # operator start until every adapter is rolled up
    pods_listed: int = 0  # pods in the operator's lists (kopf's, at its start)
    deployments_listed: int = 0
    pod_watch_events: int = 0  # the operator's, over the whole run
    server_pod_events: int = 0  # the events of the server's own pods in that time
    unrelated_pod_events: int = 0  # what was written to unrelated pods meanwhile
    pod_events: int = 0
    calls_per_pod_event: float = 0.0
    pod_event_calls: dict[str, int] = dataclasses.field(default_factory=dict)  # "verb resource" -> count
    agent_watch_events: int = 0
    agent_bound: int = 0  # 2 x adapters x states
    settle_s: float = 0.0  # agents' reports until every adapter is Loaded and Current
    peak_rss_mib: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)


def _in_parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int = 16) -> None:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(fn, items))


def _wait(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def _quiet(counter: CountingEmulator, *, seconds: float = 2.0, timeout: float = 300) -> None:
    """Until the operator has made no request for `seconds` (its backlog of events is worked off)."""
    deadline = time.monotonic() + timeout
    last, since = counter.total(client=OPERATOR_CLIENT), time.monotonic()
    while time.monotonic() - since < seconds and time.monotonic() < deadline:
        time.sleep(0.2)
        now = counter.total(client=OPERATOR_CLIENT)
        if now != last:
            last, since = now, time.monotonic()


def peak_rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _adapter(name: str, server: str) -> dict[str, Any]:
    return {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"modelServer": server, "source": {"uri": f"s3://bucket/{name}/"}},
    }


def _server(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"model": {"name": "org/tiny-moe"}},
    }


def _pod(name: str, labels: dict[str, str], namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def _fill(rest: Rest, costs: Costs) -> None:
    """Unrelated pods and a Deployment, the two servers, their adapters, one ready pod of the server."""
    pods = "/api/v1/namespaces/apps/pods"
    _in_parallel(
        lambda i: rest.request(method="POST", path=pods, body=_pod(f"web-{i}", {"app": "web"}, "apps")),
        range(costs.unrelated_pods),
    )
    web = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "apps", "labels": {"app": "web"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}}},
    }
    rest.request(method="POST", path="/apis/apps/v1/namespaces/apps/deployments", body=web)
    crs = f"/apis/moelora.io/v1alpha1/namespaces/{NS}"
    for name in (SERVER, OTHER):
        rest.request(method="POST", path=f"{crs}/modelservers", body=_server(name))
    adapters = [(f"a{i:05d}", SERVER) for i in range(costs.adapters)]
    adapters += [(f"o{i:05d}", OTHER) for i in range(costs.other_adapters)]
    _in_parallel(lambda item: rest.request(method="POST", path=f"{crs}/loraadapters", body=_adapter(*item)), adapters)
    rest.request(method="POST", path=f"/api/v1/namespaces/{NS}/pods", body=_pod(f"{SERVER}-0", LABELS))
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    rest.request(method="PATCH", path=f"/api/v1/namespaces/{NS}/pods/{SERVER}-0/status", body=ready)


def _rolled_up(kube: KubeAPI, count: int, *, phase: str | None = None) -> bool:
    def check() -> bool:
        done = 0
        for (_, ns, name), obj in kube.emulator.objects.items():
            if obj.deleted or ns != NS or not name.startswith("a") or obj.raw.get("kind") != "LoRAAdapter":
                continue
            status = obj.raw.get("status") or {}
            if status.get("desiredReplicas") == 1 and (phase is None or status.get("phase") == phase):
                done += status.get("rollup") != "Stale"
        return done == count

    return bool(kube.call(check))


def _pod_events(rest: Rest, rounds: int) -> int:
    """Pods of the server that come (not ready), change without a readiness change, and go: 3 events a round."""
    pods = f"/api/v1/namespaces/{NS}/pods"
    for index in range(rounds):
        name = f"{SERVER}-x{index}"
        rest.request(method="POST", path=pods, body=_pod(name, LABELS))
        restarted = {"status": {"containerStatuses": [{"name": "c", "restartCount": index}]}}
        rest.request(method="PATCH", path=f"{pods}/{name}/status", body=restarted)
        rest.request(method="DELETE", path=f"{pods}/{name}")
    return 3 * rounds


def _unrelated_churn(rest: Rest, count: int) -> int:
    """What kubelets write to other pods all the time: a status change on each of `count` of them."""
    body = {"status": {"phase": "Running"}}
    path = "/api/v1/namespaces/apps/pods/web-{}/status"
    _in_parallel(lambda i: rest.request(method="PATCH", path=path.format(i), body=body), range(count))
    return count


def _agents_report(rest: Rest, costs: Costs) -> None:
    """Both servers' agents report each adapter in each state, as moelora.agent.report.kube.Kube.patch_replica
    writes."""
    adapters = [(f"a{i:05d}", f"{SERVER}-0") for i in range(costs.adapters)]
    adapters += [(f"o{i:05d}", f"{OTHER}-0") for i in range(costs.other_adapters)]
    for state in AGENT_STATES:
        stamp = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entry = {"loaded": state == "Loaded", "state": state, "observedAt": stamp}

        def report(item: tuple[str, str], entry: dict[str, Any] = entry) -> None:
            name, pod = item
            body = {"status": {"replicas": {pod: entry}, "rollup": "Stale"}}
            path = f"/apis/moelora.io/v1alpha1/namespaces/{NS}/loraadapters/{name}/status"
            rest.request(method="PATCH", path=path, body=body)

        _in_parallel(report, adapters)


def measure(costs: Costs, *, timeout: float = 600) -> Costs:
    api = KubeAPI(validate=True)
    api.emulator = CountingEmulator()
    counter: CountingEmulator = api.emulator
    with api as kube:
        rest = Rest(url=kube.url)
        _fill(rest, costs)
        counter.reset()
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "MOELORA_RESYNC_SECONDS": "3600"}
        log = tempfile.NamedTemporaryFile(prefix="operator-", suffix=".log", delete=False)  # noqa: SIM115
        start = time.monotonic()
        command = [sys.executable, "-m", "moelora.operator"]
        operator = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        watcher = None
        try:
            _wait(lambda: _rolled_up(kube, costs.adapters), timeout=timeout, what="the operator's first roll-up")
            costs.startup_s = time.monotonic() - start
            _quiet(counter)  # the other server's adapters and the echoes of the roll-up's writes

            before = counter.total(client=OPERATOR_CLIENT)
            calls_before = dict(counter.requests)
            pod_events_before = counter.watch_events[("kopf", "pods")]
            costs.unrelated_pod_events = _unrelated_churn(rest, min(costs.unrelated_pods, 300))
            costs.pod_events = _pod_events(rest, rounds=10)
            _wait(lambda: counter.watch_events[("kopf", "pods")] >= pod_events_before + costs.pod_events,
                  timeout=60, what="the operator's pod events")  # fmt: skip
            time.sleep(2)
            costs.calls_per_pod_event = (counter.total(client=OPERATOR_CLIENT) - before) / costs.pod_events
            costs.pod_event_calls = {
                f"{verb} {resource}": count - calls_before.get((who, verb, resource), 0)
                for (who, verb, resource), count in counter.requests.items()
                if who == OPERATOR_CLIENT and count > calls_before.get((who, verb, resource), 0)
            }

            client = kubernetes.config.new_client_from_config(config_file=str(kube.kubeconfig))
            watcher = AdapterWatcher(
                kube=Kube(client=client, namespace=NS), model_server=SERVER, on_change=lambda: None
            )
            watcher.start()
            assert watcher.synced.wait(60), "the agent's watch did not sync"
            time.sleep(1)
            agent_before = counter.watch_events[(OPERATOR_CLIENT, "loraadapters")]
            start = time.monotonic()
            _agents_report(rest, costs)
            _wait(lambda: _rolled_up(kube, costs.adapters, phase="Loaded"), timeout=timeout, what="Loaded")
            costs.settle_s = time.monotonic() - start
            _quiet(counter)
            costs.agent_watch_events = counter.watch_events[(OPERATOR_CLIENT, "loraadapters")] - agent_before
            costs.agent_bound = 2 * costs.adapters * len(AGENT_STATES)
            costs.pod_watch_events = counter.watch_events[("kopf", "pods")]
            costs.server_pod_events = costs.pod_events
            costs.pods_listed = counter.listed[("kopf", "pods")]
            costs.deployments_listed = counter.listed[("kopf", "deployments")]
            costs.peak_rss_mib = peak_rss_mib(operator.pid)
        finally:
            if watcher is not None:
                watcher.stop()
            costs.errors = stop_operator(operator, pathlib.Path(log.name))
    return costs


def stop_operator(operator: subprocess.Popen[bytes], log: pathlib.Path) -> list[str]:
    """Stop the operator process (SIGTERM, then SIGKILL after 30 s) and return the ERROR lines of its log."""
    operator.terminate()
    try:
        operator.wait(timeout=30)
    except subprocess.TimeoutExpired:
        operator.kill()
        operator.wait()
    return [line for line in log.read_text().splitlines() if " ERROR " in line]
