"""What the operator costs the API server does not grow with the cluster: pod events of a server cost the same API
calls with 1 adapter as with 200 (re-judged from kopf's index, not read back one by one), and pods and Deployments
that are not a moelora server's never reach the operator (server-side label selectors)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.apiserver.counting import CountingEmulator
from moelora.operator.settings import Settings

from .cluster import LORA, server_pod
from .conftest import running_operator

OPERATOR = "openapi-generator"  # the operator's handlers (kopf's own watches say `kopf`)
EVENTS = 8  # rounds of three pod events each
PER_EVENT = 1  # API calls a pod event may cost beyond the 1-adapter server's


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    api = KubeAPI()
    api.emulator = CountingEmulator()
    with api, running_operator(api):
        yield api


def counter(kube: KubeAPI) -> CountingEmulator:
    assert isinstance(kube.emulator, CountingEmulator)
    return kube.emulator


def server(namespace: str) -> dict:
    return {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "qwen-moe", "namespace": namespace},
        "spec": {"model": {"name": "org/tiny-moe"}},
    }


def adapter(namespace: str, index: int) -> dict:
    return {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": f"a{index:03d}", "namespace": namespace},
        "spec": {"modelServer": "qwen-moe", "source": {"uri": f"s3://bucket/a{index}/"}},
    }


def settle(kube: KubeAPI, namespace: str, adapters: int) -> None:
    """Until every adapter is rolled up against the ready pod (the operator's work from creation is done)."""
    deadline = time.monotonic() + 60
    while True:
        done = [a for a in kube.list(LORA, namespace) if (a.get("status") or {}).get("desiredReplicas") == 1]
        if len(done) == adapters:
            return
        assert time.monotonic() < deadline, f"{len(done)} of {adapters} adapters rolled up"
        time.sleep(0.1)


def cost_of_pod_events(kube: KubeAPI, namespace: str, adapters: int) -> int:
    """The operator's API calls for 3 x EVENTS pod events of a server with `adapters` adapters."""
    rest = Rest(url=kube.url)
    rest.request(method="POST", path=f"/apis/moelora.io/v1alpha1/namespaces/{namespace}/modelservers",
                 body=server(namespace))  # fmt: skip
    for index in range(adapters):
        rest.request(method="POST", path=f"/apis/moelora.io/v1alpha1/namespaces/{namespace}/loraadapters",
                     body=adapter(namespace, index))  # fmt: skip
    pods = f"/api/v1/namespaces/{namespace}/pods"
    rest.request(method="POST", path=pods, body=server_pod(namespace))
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    rest.request(method="PATCH", path=f"{pods}/qwen-moe-abc/status", body=ready)
    settle(kube, namespace, adapters)
    time.sleep(1)  # the echoes of the roll-up's own writes
    counter(kube).reset()
    for index in range(EVENTS):
        # A pod that comes (not ready), changes without a readiness change (what a kubelet writes), and goes.
        name = f"qwen-moe-x{index}"
        rest.request(method="POST", path=pods, body=server_pod(namespace, name=name))
        restarted = {"status": {"containerStatuses": [{"name": "vllm", "restartCount": index}]}}
        rest.request(method="PATCH", path=f"{pods}/{name}/status", body=restarted)
        rest.request(method="DELETE", path=f"{pods}/{name}")
    deadline = time.monotonic() + 30
    while counter(kube).watch_events[("kopf", "pods")] < 3 * EVENTS:
        assert time.monotonic() < deadline, "the operator's pod watch did not deliver the events"
        time.sleep(0.05)
    time.sleep(1.5)  # the handlers of the last events
    return counter(kube).total(client=OPERATOR)


def test_pod_events_cost_the_same_with_1_or_200_adapters(kube: KubeAPI) -> None:
    one = cost_of_pod_events(kube, "one", 1)
    many = cost_of_pod_events(kube, "many", 200)
    assert many <= one + PER_EVENT * 3 * EVENTS, (one, many, dict(counter(kube).requests))


def test_other_pods_and_deployments_never_reach_the_operator(kube: KubeAPI) -> None:
    rest = Rest(url=kube.url)
    counter(kube).reset()
    for index in range(20):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web-{index}", "labels": {"app": "web"}}}
        rest.request(method="POST", path="/api/v1/namespaces/other/pods", body=pod)
    # Managed by moelora but not a server's pod (no server label): not ours to watch either.
    stray = {"app.kubernetes.io/managed-by": "moelora"}
    rest.request(method="POST", path="/api/v1/namespaces/other/pods",
                 body={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "labels": stray}})  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}}},
    }
    rest.request(method="POST", path="/apis/apps/v1/namespaces/other/deployments", body=deployment)
    # A pod of a server after them: once the operator has its event, it would have had theirs.
    rest.request(method="POST", path="/api/v1/namespaces/other/pods", body=server_pod("other"))
    deadline = time.monotonic() + 30
    while counter(kube).watch_events[("kopf", "pods")] < 1:
        assert time.monotonic() < deadline, "the operator's pod watch did not deliver the server's pod"
        time.sleep(0.05)
    time.sleep(0.5)
    assert counter(kube).watch_events[("kopf", "pods")] == 1
    assert counter(kube).watch_events[("kopf", "deployments")] == 0


async def test_a_servers_adapters_are_rolled_up_a_few_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass writes a server's adapters' roll-ups concurrently, never more than ROLLUP_CONCURRENCY at once (the
    executor stays open to other servers' passes), and every one of them."""
    import concurrent.futures
    import threading

    from moelora.operator.control import lora_adapters
    from moelora.operator.control.context import Context
    from moelora.operator.decide import plan

    key = ("ns", "srv")
    names = [f"a{i}" for i in range(40)]
    meta = {"namespace": "ns", "resourceVersion": "1"}
    rollups = [
        plan.Rollup(
            body={"metadata": {**meta, "name": name}},
            patch={"phase": "Loaded"},
            emission=None,
            inputs=0,
            remember=False,
        )  # fmt: skip
        for name in names
    ]
    lock, running, peak, written = threading.Lock(), [0], [0], []

    def fake_write(*, memo: Context, rollup: plan.Rollup) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
            written.append(rollup.body["metadata"]["name"])

    monkeypatch.setattr(lora_adapters, "write_rollup", fake_write)
    executor = concurrent.futures.ThreadPoolExecutor(16)
    memo = Context(settings=Settings(), kernel_bundle=None, api=None, executor=executor)
    await lora_adapters.write_rollups(memo=memo, key=key, rollups=rollups)
    executor.shutdown()
    assert sorted(written) == sorted(names)
    assert peak[0] == lora_adapters.ROLLUP_CONCURRENCY
