"""Built-in objects come back as a real API server stores them: empty `omitempty` fields of Go structs dropped, map
entries kept with their "" values; custom objects as sent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.apiserver.encoding import store_as_encoded


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        yield api


def deployment(name: str, env: list[dict[str, str]]) -> dict:
    labels = {"app": name, "empty": ""}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": {}},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "main", "image": "example.com/x:1", "args": [], "env": env}],
                    "nodeSelector": {"disk": ""},
                    "tolerations": [],
                },
            },
        },
    }


def test_an_empty_env_value_is_dropped_and_map_entries_kept(kube: KubeAPI) -> None:
    rest = Rest(url=kube.url)
    env = [{"name": "EMPTY", "value": ""}, {"name": "SET", "value": "x"}]
    created = rest.request(method="POST", path="/apis/apps/v1/namespaces/default/deployments",
                           body=deployment("web", env))  # fmt: skip
    stored = kube.get("apps/v1/deployments", "default", "web")
    assert created == stored
    assert stored is not None
    pod = stored["spec"]["template"]["spec"]
    assert pod["containers"][0]["env"] == [{"name": "EMPTY"}, {"name": "SET", "value": "x"}]
    assert "args" not in pod["containers"][0] and "tolerations" not in pod  # empty lists: omitted
    assert "annotations" not in stored["metadata"]  # an empty map: omitted
    assert stored["metadata"]["labels"] == {"app": "web", "empty": ""}  # entries of a map: kept
    assert pod["nodeSelector"] == {"disk": ""}
    assert stored["spec"]["selector"]["matchLabels"]["empty"] == ""


def test_a_patch_is_stored_encoded_too(kube: KubeAPI) -> None:
    rest = Rest(url=kube.url)
    rest.request(method="POST", path="/apis/apps/v1/namespaces/default/deployments",
                 body=deployment("patched", [{"name": "A", "value": "1"}]))  # fmt: skip
    env = [{"name": "A", "value": ""}]
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "example.com/x:1", "env": env}]}}}}
    patched = rest.request(method="PATCH", path="/apis/apps/v1/namespaces/default/deployments/patched", body=patch)
    assert patched["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "A"}]


def test_a_config_map_keeps_an_empty_data_entry(kube: KubeAPI) -> None:
    rest = Rest(url=kube.url)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"empty": "", "full": "1"}}
    rest.request(method="POST", path="/api/v1/namespaces/default/configmaps", body=body)
    stored = kube.get("v1/configmaps", "default", "cm")
    assert stored is not None and stored["data"] == {"empty": "", "full": "1"}


def test_a_custom_object_is_stored_as_sent(kube: KubeAPI) -> None:
    rest = Rest(url=kube.url)
    body = {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "ms"},
        "spec": {"model": {"name": "org/tiny-moe"}, "env": [{"name": "EMPTY", "value": ""}]},
    }
    rest.request(method="POST", path="/apis/moelora.io/v1alpha1/namespaces/default/modelservers", body=body)
    stored = kube.get("moelora.io/v1alpha1/modelservers", "default", "ms")
    assert stored is not None and stored["spec"]["env"] == [{"name": "EMPTY", "value": ""}]


def test_required_fields_empty_structs_and_untyped_values_stay() -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "r"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": []}],  # verbs: no omitempty
    }
    store_as_encoded(role, group="rbac.authorization.k8s.io", version="v1", kind="Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": []}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "resources": {}, "securityContext": {}}]}}  # fmt: skip
    store_as_encoded(pod, group="", version="v1", kind="Pod")
    assert pod["spec"]["containers"][0] == {"name": "c", "resources": {}, "securityContext": {}}  # structs
    crd_default = {"type": "string", "default": "", "description": ""}
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "xs.example.com"},
        "spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"x": crd_default}}}}]},
    }
    store_as_encoded(crd, group="apiextensions.k8s.io", version="v1", kind="CustomResourceDefinition")
    # A JSON default is a pointer, kept even when ""; an empty description string is dropped.
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["x"] == {"type": "string", "default": ""}
