"""Label and field selectors in the emulated API server: parsed as Kubernetes does, applied on lists and watches."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI
from moelora.local.apiserver.selectors import Requirement, Selector, SelectorError, parse_fields, parse_labels

LABELS = {"app": "web", "tier": "front", "moelora.io/model-server": "a", "size": "7"}


def selects(label_selector: str, labels: dict[str, str] = LABELS) -> bool:
    return Selector.from_params({"labelSelector": label_selector}).matches({"metadata": {"labels": labels}})


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app = web , tier=front", True),
        ("app=db", False),
        ("app!=db", True),
        ("missing!=x", True),  # != and notin also select objects without the key
        ("app in (web, db)", True),
        ("app in (db)", False),
        ("app notin (db,cache)", True),
        ("missing notin (x)", True),
        ("app", True),
        ("!app", False),
        ("!missing", True),
        ("moelora.io/model-server=a", True),
        ("moelora.io/model-server in (b,c)", False),
        ("size>5", True),
        ("size<5", False),
        ("app>5", False),  # not an integer: no match
        ("app=web,!tier", False),
        ("missing=", False),
        ("missing in (x,)", False),
    ],
)
def test_label_selectors_match_as_on_kubernetes(selector: str, expected: bool) -> None:
    assert selects(selector) is expected


def test_empty_value_and_empty_set_member() -> None:
    assert selects("opt=", {"opt": ""}) and selects("opt in (,x)", {"opt": ""})
    assert parse_labels("k in (a,,b)") == [Requirement("k", "in", frozenset({"a", "", "b"}))]


@pytest.mark.parametrize(
    "selector",
    ["app=", "app in ()", "app in (a", "app in a", "=web", "app=web,", "app=web tier=front", "-bad=x",
     "app=w@b", "a/b/c=x", "x" * 64 + "=y", "app>x", ",app"],
)  # fmt: skip
def test_malformed_label_selectors_are_refused(selector: str) -> None:
    if selector == "app=":  # an empty value is allowed: the key must be present with the value ""
        assert parse_labels(selector) == [Requirement("app", "=", frozenset({""}))]
        return
    with pytest.raises(SelectorError):
        parse_labels(selector)


def test_field_selectors_parse_with_escapes_and_refuse_unknown_fields() -> None:
    assert parse_fields(r"metadata.name=a\,b,spec.x!=c\=d") == [("metadata.name", "=", "a,b"), ("spec.x", "!=", "c=d")]
    assert parse_fields("metadata.name==") == [("metadata.name", "=", "")]
    for bad in ("metadata.name", "a=b=c", "metadata.name=a,", "x\\"):
        with pytest.raises(SelectorError):
            parse_fields(bad)
    with pytest.raises(SelectorError, match="not supported"):
        Selector.from_params({"fieldSelector": "spec.modelServer=a"})
    selector = Selector.from_params({"fieldSelector": "spec.modelServer=a"}, selectable={"spec.modelServer"})
    assert selector.matches({"spec": {"modelServer": "a"}}) and not selector.matches({"spec": {"modelServer": "b"}})
    assert not selector.matches({"spec": {}})


# -- over HTTP ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        yield api


def _request(kube: KubeAPI, path: str, **params: str) -> Any:
    url = f"{kube.url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        raw = response.read().decode()
    if params.get("watch"):
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    return json.loads(raw)


def _post(kube: KubeAPI, path: str, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    request = urllib.request.Request(
        kube.url + path, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=10).read()


def adapter(name: str, server: str) -> dict[str, Any]:
    return {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": name, "namespace": "sel"},
        "spec": {"modelServer": server, "source": {"uri": "s3://bucket/x/"}},
    }


def test_lists_and_watches_honour_selectors(kube: KubeAPI) -> None:
    pods = "/api/v1/namespaces/sel/pods"
    for name, labels in (("p1", {"app": "a"}), ("p2", {"app": "b", "x": "1"}), ("p3", {})):
        _post(kube, pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}})
    names = lambda body: sorted(item["metadata"]["name"] for item in body["items"])  # noqa: E731
    assert names(_request(kube, pods, labelSelector="app")) == ["p1", "p2"]
    assert names(_request(kube, pods, labelSelector="app notin (a)")) == ["p2", "p3"]
    assert names(_request(kube, pods, labelSelector="app in (a,b),x")) == ["p2"]
    listed = _request(kube, pods, labelSelector="app=a")
    _post(kube, pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p4", "labels": {"app": "a"}}})
    _post(kube, pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p5", "labels": {"app": "c"}}})
    events = _request(
        kube, pods, watch="true", labelSelector="app=a", resourceVersion=listed["metadata"]["resourceVersion"],
        timeoutSeconds="1",
    )  # fmt: skip
    assert [event["object"]["metadata"]["name"] for event in events] == ["p4"]


def test_lora_adapters_are_selectable_by_their_server(kube: KubeAPI) -> None:
    path = "/apis/moelora.io/v1alpha1/namespaces/sel/loraadapters"
    for name, server in (("l1", "a"), ("l2", "b"), ("l3", "a")):
        _post(kube, path, adapter(name, server))
    listed = _request(kube, path, fieldSelector="spec.modelServer=a")
    assert sorted(item["metadata"]["name"] for item in listed["items"]) == ["l1", "l3"]
    events = _request(kube, path, watch="true", fieldSelector="spec.modelServer!=a", timeoutSeconds="1")
    assert [event["object"]["metadata"]["name"] for event in events] == ["l2"]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/namespaces/sel/pods", {"labelSelector": "app in ("}),
        ("/api/v1/namespaces/sel/pods", {"fieldSelector": "spec.modelServer=a"}),
        ("/api/v1/namespaces/sel/configmaps", {"watch": "true", "labelSelector": "=x"}),
    ],
)
def test_malformed_or_unsupported_selectors_get_400(kube: KubeAPI, path: str, params: dict[str, str]) -> None:
    with pytest.raises(urllib.error.HTTPError) as error:
        _request(kube, path, **params)
    assert error.value.code == 400
    assert json.loads(error.value.read())["reason"] == "BadRequest"


def test_an_object_leaving_or_entering_a_selection_is_deleted_or_added_in_the_watch(kube: KubeAPI) -> None:
    path = "/apis/moelora.io/v1alpha1/namespaces/sel/loraadapters"
    _post(kube, path, adapter("mover", "x"))
    listed = _request(kube, path, fieldSelector="spec.modelServer=x")
    version = listed["metadata"]["resourceVersion"]
    move = json.dumps({"spec": {"modelServer": "y"}}).encode()
    for _ in range(2):  # to y and back to x
        request = urllib.request.Request(
            f"{kube.url}{path}/mover",
            data=move,
            method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"},
        )
        urllib.request.urlopen(request, timeout=10).read()
        move = json.dumps({"spec": {"modelServer": "x"}}).encode()
    params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "1"}
    on_x = _request(kube, path, fieldSelector="spec.modelServer=x", **params)
    assert [(event["type"], event["object"]["spec"]["modelServer"]) for event in on_x] == [
        ("DELETED", "y"),
        ("ADDED", "x"),
    ]
