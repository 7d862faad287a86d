"""The emulated API server behaves like a real one where our code and tests depend on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI, merge_diff

MS = "moelora.io/v1alpha1/modelservers"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        yield api


def server(name: str, **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "moelora.io/v1alpha1",
            "kind": "ModelServer",
            "metadata": {"name": name, "namespace": "k"},
            "spec": {"model": {"name": "m"}, **spec},
        }
    )


def test_server_fills_metadata_and_defaults(kube: KubeAPI) -> None:
    kube.kubectl("apply", "-f", "-", stdin=server("meta"))
    obj = kube.get(MS, "k", "meta")
    assert obj is not None
    meta = obj["metadata"]
    assert meta["uid"] and meta["generation"] == 1 and meta["creationTimestamp"].endswith("Z")
    assert obj["spec"]["lora"] == {"maxLoras": 8, "maxLoraRank": 16, "fullySharded": False}  # schema defaults

    kube.kubectl("label", "ms", "meta", "-n", "k", "x=y")
    labelled = kube.get(MS, "k", "meta")
    assert labelled["metadata"]["generation"] == 1  # metadata changes do not bump generation
    assert int(labelled["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    kube.kubectl("patch", "ms", "meta", "-n", "k", "--type=merge", "-p", '{"spec": {"replicas": 3}}')
    assert kube.get(MS, "k", "meta")["metadata"]["generation"] == 2


def test_status_subresource_is_separate(kube: KubeAPI) -> None:
    kube.kubectl("apply", "-f", "-", stdin=server("sub"))
    kube.kubectl(
        "patch",
        "ms",
        "sub",
        "-n",
        "k",
        "--type=merge",
        "-p",
        '{"spec": {"replicas": 2}, "status": {"readyReplicas": 9}}',
    )
    obj = kube.get(MS, "k", "sub")
    assert obj["spec"]["replicas"] == 2 and "status" not in obj  # the main resource never writes status
    kube.kubectl(
        "patch",
        "ms",
        "sub",
        "-n",
        "k",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"spec": {"replicas": 5}, "status": {"readyReplicas": 1}}',
    )
    written = kube.get(MS, "k", "sub")
    assert written["status"]["readyReplicas"] == 1 and written["spec"]["replicas"] == 2  # /status writes only status
    # A status write is a write: a new resourceVersion (the operator orders its own status writes by it).
    assert int(written["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])


def test_invalid_objects_are_refused_with_422(kube: KubeAPI) -> None:
    result = kube.kubectl("apply", "-f", "-", stdin=server("bad", gpus=99), check=False)
    assert result.returncode != 0 and "spec.gpus" in result.stderr and "less than or equal to 16" in result.stderr
    assert kube.get(MS, "k", "bad") is None
    kube.kubectl("apply", "-f", "-", stdin=server("later"))
    result = kube.kubectl(
        "patch", "ms", "later", "-n", "k", "--type=merge", "-p", '{"spec": {"lora": {"maxLoraRank": 3}}}', check=False
    )
    assert result.returncode != 0 and kube.get(MS, "k", "later")["spec"]["lora"]["maxLoraRank"] == 16


def test_generate_name_and_emulated_garbage_collection(kube: KubeAPI) -> None:
    kube.kubectl("apply", "-f", "-", stdin=server("owner"))
    owner = kube.get(MS, "k", "owner")
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "generateName": "child-",
            "namespace": "k",
            "ownerReferences": [
                {
                    "apiVersion": "moelora.io/v1alpha1",
                    "kind": "ModelServer",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }
    name = json.loads(kube.kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(child)).stdout)["metadata"][
        "name"
    ]
    assert name.startswith("child-") and len(name) > len("child-")
    unrelated = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "free", "namespace": "k"}}
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(unrelated))
    kube.kubectl("delete", "ms", "owner", "-n", "k")
    assert kube.get("v1/configmaps", "k", name) is None
    assert kube.get("v1/configmaps", "k", "free") is not None


def test_kubectl_reads_lists_and_errors(kube: KubeAPI) -> None:
    missing = kube.kubectl("get", "ms", "nothing-here", "-n", "k", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
    kube.kubectl("create", "-f", "-", stdin=server("dup"))
    again = kube.kubectl("create", "-f", "-", stdin=server("dup"), check=False)
    assert again.returncode != 0 and "AlreadyExists" in again.stderr
    listed = json.loads(kube.kubectl("get", "ms", "-n", "k", "-o", "json").stdout)
    assert listed["kind"] == "List" and "dup" in [item["metadata"]["name"] for item in listed["items"]]


def test_merge_diff_round_trips() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1]}
    new = {"a": 1, "b": {"c": 4}, "e": [2], "f": 5}
    assert merge_diff(old, new) == {"b": {"c": 4, "d": None}, "e": [2], "f": 5}


def _get(kube: KubeAPI, path: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(f"{kube.url}{path}", timeout=10) as response:
        body = response.read().decode()
    return (
        [json.loads(line) for line in body.splitlines() if line.strip()] if "watch=true" in path else json.loads(body)
    )


def test_a_watch_resumes_from_a_lists_resource_version(kube: KubeAPI) -> None:
    base = "/api/v1/namespaces/w/configmaps"
    listed = _get(kube, base)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "namespace": "w", "labels": {"t": "a"}}}
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(cm))
    kube.kubectl(
        "apply", "-f", "-", stdin=json.dumps({**cm, "metadata": {**cm["metadata"], "name": "c2", "labels": {"t": "b"}}})
    )
    kube.kubectl("delete", "configmap", "c1", "-n", "w")
    # Everything that happened after the list, although the watch starts later; it ends after timeoutSeconds.
    rv = listed["metadata"]["resourceVersion"]
    events = _get(kube, f"{base}?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "c1"),
        ("ADDED", "c2"),
        ("DELETED", "c1"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 3
    selected = _get(kube, f"{base}?watch=true&resourceVersion={rv}&timeoutSeconds=1&labelSelector=t%3Db")
    assert [e["object"]["metadata"]["name"] for e in selected] == ["c2"]
    assert [i["metadata"]["name"] for i in _get(kube, f"{base}?labelSelector=t%20in%20(a,b)")["items"]] == ["c2"]
    assert _get(kube, f"{base}?fieldSelector=metadata.name%3Dc9")["items"] == []


def test_watch_list_ends_its_initial_events_with_a_bookmark(kube: KubeAPI) -> None:
    kube.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b1", "namespace": "wl"}}),
    )
    events = _get(
        kube,
        "/api/v1/namespaces/wl/configmaps?watch=true&sendInitialEvents=true"
        "&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
    )
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_secret_string_data_is_stored_as_base64_data(kube: KubeAPI) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "k"},
        "data": {"AWS_REGION": "ZXUtd2VzdC0x"},
        "stringData": {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE"},
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    stored = kube.get("v1/secrets", "k", "creds")
    assert "stringData" not in stored
    assert stored["data"] == {"AWS_REGION": "ZXUtd2VzdC0x", "AWS_ACCESS_KEY_ID": "QUtJREVYQU1QTEU="}


def test_a_failed_json_patch_test_is_422_as_kopf_expects(kube: KubeAPI) -> None:
    # kopf guards its annotation patches with a `test` of resourceVersion and retries on the next cycle on 422.
    kube.kubectl("apply", "-f", "-", stdin=server("jsonpatch"))
    stale = json.dumps([{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}])
    result = kube.kubectl("patch", "ms", "jsonpatch", "-n", "k", "--type=json", "-p", stale, check=False)
    assert result.returncode != 0 and "request is invalid" in result.stderr  # kubectl words a 422 so
