"""The agent's Kubernetes side against the emulated API server (moelora.local.apiserver): watch, Secrets, status."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest

from moelora.agent.check.validate import AdapterInfo
from moelora.agent.report.kube import PLURAL, AdapterWatcher, Kube
from moelora.api import GROUP, VERSION, AdapterPhase, ReplicaAdapterState
from moelora.local.apiserver import KubeAPI

NS = "team"


@pytest.fixture(scope="module")
def api() -> Iterator[KubeAPI]:
    with KubeAPI(namespace=NS) as server:
        yield server


@pytest.fixture
def client(api: KubeAPI) -> Iterator[kubernetes.client.ApiClient]:
    client = kubernetes.config.new_client_from_config(config_file=str(api.kubeconfig))
    yield client
    custom = kubernetes.client.CustomObjectsApi(client)
    for item in custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, item["metadata"]["name"])
    client.close()


def adapter(name: str, server: str = "srv", uri: str = "s3://bucket/a/") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LoRAAdapter",
        "metadata": {"name": name},
        "spec": {"modelServer": server, "source": {"uri": uri}},
    }


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_watch_follows_this_servers_adapters(client: kubernetes.client.ApiClient) -> None:
    custom = kubernetes.client.CustomObjectsApi(client)
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("a"))
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("other", server="another"))
    changes = threading.Semaphore(0)
    watcher = AdapterWatcher(kube=Kube(client=client, namespace=NS), model_server="srv", on_change=changes.release)
    watcher.start()
    try:
        assert watcher.synced.wait(10)
        assert [d.name for d in watcher.snapshot()] == ["a"]
        first = watcher.snapshot()[0]
        assert first.uid and first.created  # the server's metadata, for conflict ordering

        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("b", uri="s3://bucket/b/"))
        eventually(lambda: {d.name for d in watcher.snapshot()} == {"a", "b"})

        custom.patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, "a", {"spec": {"source": {"uri": "s3://bucket/a2/"}}}
        )
        eventually(lambda: any(d.spec.source.uri == "s3://bucket/a2/" for d in watcher.snapshot()))

        # Status writes (ours and other replicas') change no spec: they must not wake the loop.
        while changes.acquire(timeout=0.3):
            pass
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "a", {"status": {"replicas": {"p": {"loaded": True}}}}
        )
        assert not changes.acquire(timeout=1.0)

        # Moved to another server: no longer ours.
        custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "b", {"spec": {"modelServer": "another"}})
        eventually(lambda: [d.name for d in watcher.snapshot()] == ["a"])
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "a")
        eventually(lambda: watcher.snapshot() == [])
    finally:
        watcher.stop()


def test_each_replica_patches_only_its_own_key(client: kubernetes.client.ApiClient) -> None:
    custom = kubernetes.client.CustomObjectsApi(client)
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("a"))
    kube = Kube(client=client, namespace=NS)
    failed = ReplicaAdapterState(state=AdapterPhase.FAILED, reason="SourceNotFound", last_error="nothing under s3://x/")
    assert kube.patch_replica(name="a", pod="srv-1", state=failed, info=None)
    loaded = ReplicaAdapterState(loaded=True, state=AdapterPhase.LOADED, version="abc")
    info = AdapterInfo(rank=8, base_model="org/m", target_modules=("q_proj", "v_proj"), size_bytes=1234)
    assert kube.patch_replica(name="a", pod="srv-0", state=loaded, info=info)
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "a")
    assert obj["status"]["replicas"]["srv-1"]["reason"] == "SourceNotFound"
    assert obj["status"]["replicas"]["srv-0"]["loaded"] is True
    assert (obj["status"]["rank"], obj["status"]["targetModules"], obj["status"]["sizeBytes"]) == (
        8,
        ["q_proj", "v_proj"],
        1234,
    )
    assert obj["spec"] == adapter("a")["spec"]

    # Recovered: the stale reason and error go (explicit nulls in the merge patch), the other replica stays.
    assert kube.patch_replica(name="a", pod="srv-1", state=loaded, info=info)
    replicas = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "a")["status"]["replicas"]
    assert replicas["srv-1"].get("reason") is None and replicas["srv-1"].get("lastError") is None
    assert set(replicas) == {"srv-0", "srv-1"}
    assert kube.patch_replica(name="gone", pod="srv-0", state=loaded, info=None) is False


def test_a_refusal_reports_the_rank_it_read_in_kubectls_rank_column(
    api: KubeAPI, client: kubernetes.client.ApiClient
) -> None:
    custom = kubernetes.client.CustomObjectsApi(client)
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("big"))
    refused = ReplicaAdapterState(state=AdapterPhase.FAILED, reason="RankTooHigh", last_error="rank 64 is above 16")
    facts = AdapterInfo(rank=64, base_model="org/m", target_modules=("q_proj",))  # refused before the download
    assert Kube(client=client, namespace=NS).patch_replica(name="big", pod="srv-0", state=refused, info=facts)
    status = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "big")["status"]
    assert status["rank"] == 64 and "sizeBytes" not in status
    header, row = api.kubectl("get", "lora", "big", "-n", NS).stdout.splitlines()
    start = header.index("RANK")  # cells are aligned under their headers; empty ones (LOADED...) print nothing
    assert row[start:].split()[0] == "64"


def test_read_secret(client: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(client)
    data = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    core.create_namespaced_secret(
        NS, {"metadata": {"name": "creds"}, "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
    )
    kube = Kube(client=client, namespace=NS)
    try:
        assert kube.read_secret(name="creds") == data
        assert kube.read_secret(name="absent") is None
    finally:
        core.delete_namespaced_secret("creds", NS)


def test_watch_retries_until_the_api_answers_and_relists_after_each_watch() -> None:
    """Connection refused at first (the API server not up yet): the watcher retries with backoff, then syncs; short
    watches end and are followed by a fresh list, so nothing between two watches is missed."""
    from moelora.local import process

    port = process.free_port()
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}"))
    watcher = AdapterWatcher(
        kube=Kube(client=client, namespace=NS), model_server="srv", on_change=lambda: None, watch_timeout=1
    )
    watcher.start()
    try:
        assert not watcher.synced.wait(1.0)
        with KubeAPI(namespace=NS, port=port):
            custom = kubernetes.client.CustomObjectsApi(client)
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("first"))
            eventually(lambda: [d.name for d in watcher.snapshot()] == ["first"], timeout=20)
            time.sleep(2.5)  # at least one watch has ended and been replaced
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("second"))
            eventually(lambda: {d.name for d in watcher.snapshot()} == {"first", "second"})
            watcher.stop()
            time.sleep(1.5)  # the last watch times out on the server's side, so the emulator can stop
    finally:
        watcher.stop()
        client.close()


def test_with_placement_only_the_adapters_assigned_to_this_pod_are_desired(
    client: kubernetes.client.ApiClient,
) -> None:
    custom = kubernetes.client.CustomObjectsApi(client)
    for name in ("mine", "theirs"):
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter(name))

    def assign(name: str, pods: list[str]) -> None:
        status = {"placement": {"replicas": pods, "target": pods}}
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, name, {"status": status})

    assign("mine", ["srv-1", "srv-0"])
    assign("theirs", ["srv-2"])
    watcher = AdapterWatcher(
        kube=Kube(client=client, namespace=NS), model_server="srv", on_change=lambda: None, pod="srv-0"
    )
    watcher.start()
    try:
        assert watcher.synced.wait(10)
        assert [d.name for d in watcher.snapshot()] == ["mine"]
        # What a request may still ask this pod for (vLLM's resolver): every adapter of the server.
        assert {d.name for d in watcher.server_adapters()} == {"mine", "theirs"}
        # The operator moves an adapter here, then away: the desired set follows the status alone.
        assign("theirs", ["srv-2", "srv-0"])
        eventually(lambda: {d.name for d in watcher.snapshot()} == {"mine", "theirs"})
        assign("mine", ["srv-1"])
        eventually(lambda: [d.name for d in watcher.snapshot()] == ["theirs"])
        assert {d.name for d in watcher.server_adapters()} == {"mine", "theirs"}
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mine")
        eventually(lambda: [d.name for d in watcher.server_adapters()] == ["theirs"])
    finally:
        watcher.stop()


def test_the_on_demand_load_is_each_pods_own_key_and_goes_with_a_null(client: kubernetes.client.ApiClient) -> None:
    custom = kubernetes.client.CustomObjectsApi(client)
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, adapter("od"))
    kube = Kube(client=client, namespace=NS)
    assert kube.patch_on_demand_load(name="od", pod="srv-0", load=0.8)
    assert kube.patch_on_demand_load(name="od", pod="srv-1", load=2.0)
    status = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "od")["status"]
    assert status["onDemandLoad"] == {"srv-0": 0.8, "srv-1": 2.0}
    assert kube.patch_on_demand_load(name="od", pod="srv-0", load=None)
    status = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "od")["status"]
    assert status["onDemandLoad"] == {"srv-1": 2.0}
    assert kube.patch_on_demand_load(name="gone", pod="srv-0", load=1.0) is False
