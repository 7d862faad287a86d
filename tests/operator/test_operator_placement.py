"""Placement through the real operator against the emulated API server: a placed server becomes a StatefulSet,
its adapters' assignments appear in their status as placement predicts, and a scale moves them make-before-break.

No agents run here: the test writes what they would (`status.replicas.<pod>.loaded`) for the pods an adapter's
status assigns it to, and no StatefulSet controller either (the test reads the StatefulSet's spec only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI
from moelora.local.apiserver.client import Rest
from moelora.local.operator_thread import OperatorThread
from moelora.operator.decide import placement
from moelora.operator.decide.assignment import pod_names

from .cluster import DEPLOYMENTS, LORA, MS, apply, condition, manifest, server_pod
from .conftest import running_operator

NS = "placed"
SERVER = "qwen-moe"
STATEFULSETS = "apps/v1/statefulsets"
ADAPTERS = [f"team-{i}" for i in range(20)]


@pytest.fixture(scope="module", autouse=True)
def operator(kube: KubeAPI) -> Iterator[OperatorThread]:
    with running_operator(kube) as running:
        yield running


def eventually(check: Callable[[], Any], *, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        return result


def assignments(kube: KubeAPI) -> dict[str, dict[str, Any]]:
    return {a["metadata"]["name"]: (a.get("status") or {}).get("placement") or {} for a in kube.list(LORA, NS)}


def predicted(replicas: int) -> dict[str, list[str]]:
    homes = placement.place(
        [placement.Adapter(name, size_bytes=0) for name in ADAPTERS],
        [placement.Replica(pod) for pod in pod_names(SERVER, replicas)],
    ).homes
    return {name: list(pods) for name, pods in homes.items()}


def report_loaded(rest: Rest, adapter: str, pods: list[str]) -> None:
    """What the agents of `pods` write once they have loaded the adapter."""
    replicas = {pod: {"loaded": True, "state": "Loaded"} for pod in pods}
    rest.request(
        method="PATCH",
        path=f"/apis/moelora.io/v1alpha1/namespaces/{NS}/loraadapters/{adapter}/status",
        body={"status": {"replicas": replicas}},
    )


def scale(rest: Rest, replicas: int) -> None:
    rest.request(
        method="PATCH",
        path=f"/apis/moelora.io/v1alpha1/namespaces/{NS}/modelservers/{SERVER}",
        body={"spec": {"replicas": replicas}},
    )


def test_placed_server_moves_adapters_make_before_break(kube: KubeAPI) -> None:
    rest = Rest(url=kube.url)
    apply(kube, manifest("modelserver.yaml", namespace=NS, replicas=3, placement={"copies": 1, "drainSeconds": 0}))
    for name in ADAPTERS:
        adapter = manifest("loraadapter.yaml", namespace=NS)
        adapter["metadata"]["name"] = name
        adapter["spec"]["source"] = {"uri": f"s3://adapters/{name}/"}
        rest.request(method="POST", path=f"/apis/moelora.io/v1alpha1/namespaces/{NS}/loraadapters", body=adapter)

    # A StatefulSet of stable names with its headless Service, and no Deployment.
    sts = eventually(lambda: _assert_some(kube.get(STATEFULSETS, NS, SERVER)))
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == f"{SERVER}-pods"
    assert kube.get("v1/services", NS, f"{SERVER}-pods")["spec"]["clusterIP"] == "None"
    assert kube.get(DEPLOYMENTS, NS, SERVER) is None
    agent = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    assert {"name": "MOELORA_PLACEMENT", "value": "1"} in agent["env"]

    # Every adapter assigned where placement over <ms>-0..2 puts it.
    three = predicted(3)
    eventually(lambda: _assert_equal({n: p.get("replicas") for n, p in assignments(kube).items()}, three))
    for name, pods in three.items():
        report_loaded(rest, name, pods)

    # 3 -> 4: exactly the adapters placement moves get the new pod, and keep their old home meanwhile.
    four = predicted(4)
    moved = sorted(name for name in ADAPTERS if four[name] != three[name])
    assert moved and all(four[name] == [f"{SERVER}-3"] for name in moved)
    scale(rest, 4)
    during = {name: [*four[name], *three[name]] if name in moved else three[name] for name in ADAPTERS}
    eventually(lambda: _assert_equal({n: p.get("replicas") for n, p in assignments(kube).items()}, during))
    assert all(assignments(kube)[name]["draining"] == three[name] for name in moved)
    assert kube.get(STATEFULSETS, NS, SERVER)["spec"]["replicas"] == 4

    # The new pod reports half of them loaded: only those drop their old home.
    first, rest_moved = moved[: len(moved) // 2 + 1], moved[len(moved) // 2 + 1 :]
    for name in first:
        report_loaded(rest, name, four[name])
    halfway = {name: four[name] if name in first else during[name] for name in ADAPTERS}
    eventually(lambda: _assert_equal({n: p.get("replicas") for n, p in assignments(kube).items()}, halfway))
    for name in rest_moved:
        report_loaded(rest, name, four[name])
    eventually(lambda: _assert_equal({n: p.get("replicas") for n, p in assignments(kube).items()}, four))

    # 4 -> 3: the StatefulSet keeps <ms>-3 until the adapters leaving it are loaded on their old homes again.
    scale(rest, 3)
    draining = {name: [*three[name], *four[name]] if name in moved else three[name] for name in ADAPTERS}
    eventually(lambda: _assert_equal({n: p.get("replicas") for n, p in assignments(kube).items()}, draining))
    assert kube.get(STATEFULSETS, NS, SERVER)["spec"]["replicas"] == 4
    for name in moved:
        report_loaded(rest, name, three[name])
    eventually(lambda: _assert_equal({n: p.get("replicas") for n, p in assignments(kube).items()}, three))
    eventually(lambda: _assert_equal(kube.get(STATEFULSETS, NS, SERVER)["spec"]["replicas"], 3))


def test_adapters_past_the_pods_count_are_reported_and_auto_copies_follow_the_load(kube: KubeAPI) -> None:
    rest = Rest(url=kube.url)
    server, names = "tight", [f"tight-{i}" for i in range(5)]
    # 3 pods x 1 adapter each (maxLoras 1, so 1 CPU slot, x adaptersPerCpuLora 1): two of five adapters fit nowhere.
    spec = {"replicas": 3, "lora": {"maxLoras": 1}, "placement": {"copies": 1, "adaptersPerCpuLora": 1}}
    body = manifest("modelserver.yaml", namespace=NS, **spec)
    body["metadata"]["name"] = server
    apply(kube, body)
    for name in names:
        adapter = manifest("loraadapter.yaml", namespace=NS, modelServer=server)
        adapter["metadata"]["name"] = name
        adapter["spec"]["source"] = {"uri": f"s3://adapters/{name}/"}
        rest.request(method="POST", path=f"/apis/moelora.io/v1alpha1/namespaces/{NS}/loraadapters", body=adapter)

    def placed() -> dict[str, dict[str, Any]]:
        return {n: p for n, p in assignments(kube).items() if n in names}

    eventually(lambda: _assert_equal(sorted(p.get("short", 0) for p in placed().values()), [0, 0, 0, 1, 1]))
    assert sorted(pod for p in placed().values() for pod in p["replicas"]) == pod_names(server, 3)
    # The first reconcile may report Degraded False before the adapters are placed: judge the shortage's own report.
    degraded = eventually(lambda: _with_reason(condition(kube.get(MS, NS, server), "Degraded"), "PlacementShort"))
    assert degraded["status"] == "True"
    events = eventually(
        lambda: _assert_some([e for e in kube.list("v1/events", NS) if e["reason"] == "PlacementShort"])
    )
    assert events[0]["involvedObject"]["name"] == server and events[0]["type"] == "Warning"

    # Room for all (2 per pod), copies from load: the agents report one adapter carrying most requests in flight.
    placement_spec = {"copies": 1, "adaptersPerCpuLora": 4, "copiesMode": "Auto"}
    rest.request(
        method="PATCH",
        path=f"/apis/moelora.io/v1alpha1/namespaces/{NS}/modelservers/{server}",
        body={"spec": {"placement": placement_spec}},
    )
    eventually(lambda: _assert_equal(condition(kube.get(MS, NS, server), "Degraded")["reason"], "AsExpected"))
    for pod_name in pod_names(server, 3):  # pods that exist, so the roll-up keeps their agents' entries
        rest.request(method="POST", path=f"/api/v1/namespaces/{NS}/pods", body=server_pod(NS, pod_name, server))
    hot = names[0]
    pod = eventually(lambda: _assert_some((placed()[hot].get("replicas") or [None])[0]))
    rest.request(
        method="PATCH",
        path=f"/apis/moelora.io/v1alpha1/namespaces/{NS}/loraadapters/{hot}/status",
        body={"status": {"replicas": {pod: {"loaded": True, "state": "Loaded", "load": 3.0}}}},
    )
    # 3 of 3 in flight: ceil(1 x 3 pods x 1 slot) = 3 copies; the others keep copies' minimum, 1.
    eventually(lambda: _assert_equal((placed()[hot].get("copies"), len(placed()[hot]["target"])), (3, 3)))
    assert placed()[hot]["load"] == 3.0
    assert all(placed()[name]["copies"] == 1 for name in names[1:])


def _assert_some(value: Any) -> Any:
    assert value is not None
    return value


def _with_reason(found: dict[str, Any] | None, reason: str) -> dict[str, Any]:
    assert found is not None and found["reason"] == reason
    return found


def _assert_equal(actual: Any, expected: Any) -> None:
    assert actual == expected
