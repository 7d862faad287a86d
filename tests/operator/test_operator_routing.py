"""Gateway routing through the real operator, against an emulator that serves the InferencePool and HTTPRoute of
their published CRDs: the objects are accepted as rendered, and the body-based router's ConfigMaps (one per adapter)
follow the server's adapters as they come and go, and with routeToHome what the agents report, without waiting for a
resync (set to an hour here). No agents or kubelet run here: the test writes what they would."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread

from .cluster import LORA, apply, make_ready, manifest, patch_status, server_pod, wait_for
from .conftest import running_operator

NS = "routed"
CONFIG_MAPS = "v1/configmaps"
ROUTES = "gateway.networking.k8s.io/v1/httproutes"
POOLS = "inference.networking.k8s.io/v1/inferencepools"
ROUTING = {"gateway": {"enabled": True, "parentRefs": [{"name": "inference-gw", "namespace": "gw"}]}}


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI(published=("InferencePool", "HTTPRoute")) as api:
        yield api


@pytest.fixture(scope="module", autouse=True)
def operator(kube: KubeAPI) -> Iterator[OperatorThread]:
    with running_operator(kube) as running:
        yield running


def routes(kube: KubeAPI) -> dict[str, str]:
    """Served name -> header value, over the adapters' ConfigMaps the body-based router reads."""
    mapping = {}
    for config_map in kube.list(CONFIG_MAPS, NS):
        labels = config_map["metadata"].get("labels") or {}
        if labels.get("inference.networking.k8s.io/bbr-managed") == "true" and "adapters" in config_map["data"]:
            for name in yaml.safe_load(config_map["data"]["adapters"]):
                mapping[name] = config_map["data"]["baseModel"]
    return mapping


def wait_for_routes(kube: KubeAPI, want: dict[str, str]) -> None:
    wait_for(lambda: routes(kube) == want, what=f"the routes {want} (there are {routes(kube)})")


def adapter(name: str) -> dict:
    obj = manifest("loraadapter.yaml", namespace=NS)
    obj["metadata"]["name"] = name
    obj["spec"].pop("servedName", None)
    return obj


def test_the_config_map_follows_the_adapters(kube: KubeAPI) -> None:
    apply(kube, manifest("modelserver.yaml", namespace=NS, routing=ROUTING))
    route = wait_for(lambda: kube.get(ROUTES, NS, "qwen-moe"), what="the HTTPRoute")
    assert kube.get(POOLS, NS, "qwen-moe") is not None
    [rule] = route["spec"]["rules"]
    assert rule["matches"] == [
        {
            "headers": [{"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": "qwen-moe"}],
            "path": {"type": "PathPrefix", "value": "/"},  # the published CRD's default, filled by the server
        }
    ]
    config_map = wait_for(lambda: kube.get(CONFIG_MAPS, NS, "qwen-moe-model-names"), what="the ConfigMap")
    assert config_map["metadata"]["labels"]["inference.networking.k8s.io/bbr-managed"] == "true"
    assert config_map["data"] == {"baseModel": "qwen-moe"}

    for name in ("alpha", "beta"):
        apply(kube, adapter(name))
    wait_for_routes(kube, {"alpha": "qwen-moe", "beta": "qwen-moe"})
    owner = kube.get(CONFIG_MAPS, NS, "alpha-route")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("LoRAAdapter", "alpha")  # the garbage collector takes it with alpha

    kube.kubectl("delete", "lora", "beta", "-n", NS)
    wait_for(lambda: kube.get(LORA, NS, "beta") is None, what="beta gone")
    wait_for_routes(kube, {"alpha": "qwen-moe"})


def test_routing_to_homes_follows_the_agents_reports(kube: KubeAPI) -> None:
    """routeToHome: a Service per pod and a route of their header values; alpha, placed on one pod, goes through the
    pool until that pod's agent reports it loaded and the pod is ready, then straight to the pod, and back to the
    pool when the pod stops being ready."""
    home = {"gateway": {**ROUTING["gateway"], "routeToHome": True}}
    apply(kube, manifest("modelserver.yaml", namespace=NS, routing=home, replicas=2, placement={"copies": 1}))
    route = wait_for(lambda: kube.get(ROUTES, NS, "qwen-moe-homes-0"), what="the homes' HTTPRoute")
    assert [rule["backendRefs"][0]["name"] for rule in route["spec"]["rules"]] == ["qwen-moe-home-0", "qwen-moe-home-1"]
    for ordinal in (0, 1):
        assert kube.get("v1/services", NS, f"qwen-moe-home-{ordinal}") is not None
    placed = wait_for(
        lambda: ((kube.get(LORA, NS, "alpha") or {}).get("status") or {}).get("placement"), what="alpha placed"
    )
    [pod] = placed["target"]
    assert routes(kube) == {"alpha": "qwen-moe"}
    apply(kube, server_pod(NS, pod, "qwen-moe"))
    make_ready(kube, NS, pod)
    uid = kube.get(CONFIG_MAPS, NS, "alpha-route")["metadata"]["uid"]
    patch_status(kube, "lora", "alpha", NS, {"replicas": {pod: {"loaded": True, "state": "Loaded"}}})
    wait_for_routes(kube, {"alpha": f"qwen-moe@{pod}"})
    patch_status(kube, "pod", pod, NS, {"conditions": [{"type": "Ready", "status": "False"}]})
    wait_for_routes(kube, {"alpha": "qwen-moe"})
    # Patched in place each time: BBR sees one update of one ConfigMap, never the name dropped by any.
    assert kube.get(CONFIG_MAPS, NS, "alpha-route")["metadata"]["uid"] == uid
    # Routing to homes turned off again: the per-pod Services and the homes' route are deleted.
    off = {"spec": {"routing": {"gateway": {"routeToHome": False}}}}
    kube.kubectl("patch", "ms", "qwen-moe", "-n", NS, "--type=merge", "-p", json.dumps(off))
    for resource, name in ((ROUTES, "qwen-moe-homes-0"), ("v1/services", "qwen-moe-home-1")):
        wait_for(lambda r=resource, n=name: kube.get(r, NS, n) is None, what=f"{resource} {name} deleted")
    kube.kubectl("delete", "lora", "alpha", "-n", NS)
    wait_for_routes(kube, {})


def test_turning_routing_off_deletes_the_routing_children(kube: KubeAPI) -> None:
    kube.kubectl(
        "patch",
        "ms",
        "qwen-moe",
        "-n",
        NS,
        "--type=merge",
        "-p",
        '{"spec": {"routing": {"gateway": {"enabled": false}}}}',
    )
    for resource, name in ((ROUTES, "qwen-moe"), (POOLS, "qwen-moe"), (CONFIG_MAPS, "qwen-moe-model-names")):
        wait_for(lambda r=resource, n=name: kube.get(r, NS, n) is None, what=f"{resource} {name} deleted")
