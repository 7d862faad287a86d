"""The emulated garbage collector deletes an object whose owners are all absent when that object is written, not only
when an owner goes, as a real cluster's does: a reconcile still running after its owner's deletion may re-create
or patch a child, which a real GC deletes soon after. The write itself succeeds and returns the object."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI, Rest

NS = "gc"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        yield api


@pytest.fixture
def rest(kube: KubeAPI) -> Rest:
    return Rest(url=kube.url)


def config_map(name: str, *owners: dict[str, Any], finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "ownerReferences": [ref(owner) for owner in owners]}
    if finalizers:
        meta["finalizers"] = list(finalizers)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def ref(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}


def gone_owner(rest: Rest, name: str) -> dict[str, Any]:
    """A ConfigMap created and deleted again: its uid names no object any more."""
    owner = rest.request(method="POST", path=CONFIGMAPS, body=config_map(name))
    rest.request(method="DELETE", path=f"{CONFIGMAPS}/{name}")
    return owner


def wait_gone(kube: KubeAPI, name: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while kube.get("v1/configmaps", NS, name) is not None:
        assert time.monotonic() < deadline, f"{name} was not collected within {timeout} s"
        time.sleep(0.02)


def settled(kube: KubeAPI, rest: Rest, name: str) -> None:
    """Wait until the collector has looked at everything written so far: it checks writes in order, so a dangling
    object written now goes only after those."""
    rest.request(method="POST", path=CONFIGMAPS, body=config_map(name, gone_owner(rest, f"{name}-owner")))
    wait_gone(kube, name)


def test_an_object_created_naming_only_a_gone_owner_is_collected_soon_after(kube: KubeAPI, rest: Rest) -> None:
    owner = gone_owner(rest, "owner-a")
    live = rest.request(method="POST", path=CONFIGMAPS, body=config_map("live-owner"))
    created = rest.request(method="POST", path=CONFIGMAPS, body=config_map("late-child", owner))
    assert created["metadata"]["uid"] and created["metadata"]["ownerReferences"] == [ref(owner)]  # the write succeeds
    rest.request(method="POST", path=CONFIGMAPS, body=config_map("kept-child", owner, live))
    wait_gone(kube, "late-child")
    settled(kube, rest, "settle-a")
    assert kube.get("v1/configmaps", NS, "kept-child") is not None  # one live owner keeps it


def test_an_object_patched_to_name_only_a_gone_owner_is_collected(kube: KubeAPI, rest: Rest) -> None:
    owner = gone_owner(rest, "owner-b")
    rest.request(method="POST", path=CONFIGMAPS, body=config_map("adopted"))
    patch = {"metadata": {"ownerReferences": [ref(owner)]}}
    patched = rest.request(method="PATCH", path=f"{CONFIGMAPS}/adopted", body=patch)
    assert patched["metadata"]["ownerReferences"] == [ref(owner)]
    wait_gone(kube, "adopted")


def test_an_owner_named_wrongly_is_absent(kube: KubeAPI, rest: Rest) -> None:
    live = rest.request(method="POST", path=CONFIGMAPS, body=config_map("renamed-owner"))
    misnamed = config_map("misnamed")
    misnamed["metadata"]["ownerReferences"] = [{**ref(live), "name": "someone-else"}]
    rest.request(method="POST", path=CONFIGMAPS, body=misnamed)
    wait_gone(kube, "misnamed")  # the real GC looks the owner up by name, then compares the uid


def test_finalizers_hold_a_collected_object_and_its_dependents_follow_it(kube: KubeAPI, rest: Rest) -> None:
    owner = gone_owner(rest, "owner-c")
    held = rest.request(method="POST", path=CONFIGMAPS, body=config_map("held", owner, finalizers=("example.com/x",)))
    deadline = time.monotonic() + 5
    while not (kube.get("v1/configmaps", NS, "held") or {}).get("metadata", {}).get("deletionTimestamp"):
        assert time.monotonic() < deadline, "held was not marked for deletion"
        time.sleep(0.02)
    rest.request(method="POST", path=CONFIGMAPS, body=config_map("held-child", held))
    settled(kube, rest, "settle-c")
    assert kube.get("v1/configmaps", NS, "held-child") is not None  # an owner being deleted is still there
    rest.request(method="PATCH", path=f"{CONFIGMAPS}/held", body={"metadata": {"finalizers": None}})
    wait_gone(kube, "held")
    wait_gone(kube, "held-child")


def test_an_owner_that_cannot_be_resolved_keeps_the_object(kube: KubeAPI, rest: Rest) -> None:
    owner = gone_owner(rest, "owner-d")
    # A cluster-scoped dependent naming a namespaced owner, and an owner of a kind nobody serves: the real GC cannot
    # resolve either and never collects them (kubernetes.io garbage-collection, "Owners and dependents").
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "cluster-child", "ownerReferences": [ref(owner)]}}  # fmt: skip
    rest.request(method="POST", path="/apis/rbac.authorization.k8s.io/v1/clusterroles", body=role)
    unknown = {**ref(owner), "apiVersion": "example.com/v1", "kind": "Nothing"}
    body = config_map("unknown-owner")
    body["metadata"]["ownerReferences"] = [unknown]
    rest.request(method="POST", path=CONFIGMAPS, body=body)
    settled(kube, rest, "settle-d")
    assert kube.get("rbac.authorization.k8s.io/v1/clusterroles", None, "cluster-child") is not None
    assert kube.get("v1/configmaps", NS, "unknown-owner") is not None
