"""Gateway routing through the real operator, against an emulator that serves the InferencePool and HTTPRoute of
their published CRDs: the objects are accepted as rendered, and the body-based router's ConfigMap follows the
server's adapters as they come and go, without waiting for a resync (set to an hour here)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread

from .cluster import LORA, apply, manifest, wait_for
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


def listed_adapters(kube: KubeAPI) -> list[str] | None:
    config_map = kube.get(CONFIG_MAPS, NS, "qwen-moe-model-names")
    if config_map is None:
        return None
    return sorted(yaml.safe_load(config_map["data"].get("adapters") or "[]"))


def wait_for_adapters(kube: KubeAPI, want: list[str]) -> None:
    wait_for(
        lambda: listed_adapters(kube) == want, what=f"the ConfigMap to list {want} (it lists {listed_adapters(kube)})"
    )


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
    assert config_map["data"]["baseModel"] == "qwen-moe"

    for name in ("alpha", "beta"):
        apply(kube, adapter(name))
    wait_for_adapters(kube, ["alpha", "beta"])

    kube.kubectl("delete", "lora", "beta", "-n", NS)
    wait_for(lambda: kube.get(LORA, NS, "beta") is None, what="beta gone")
    wait_for_adapters(kube, ["alpha"])

    kube.kubectl("delete", "lora", "alpha", "-n", NS)
    wait_for_adapters(kube, [])
    assert "adapters" not in kube.get(CONFIG_MAPS, NS, "qwen-moe-model-names")["data"]  # the stale list removed


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
