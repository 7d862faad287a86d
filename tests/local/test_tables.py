"""The emulator's Tables and OpenAPI documents, read over HTTP as clients other than kubectl would."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI
from moelora.local.apiserver.printers import human_duration
from moelora.local.apiserver.tables import jsonpath, table_version

TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
LORAS = "/apis/moelora.io/v1alpha1/namespaces/t/loraadapters"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        for name in ("a", "b"):
            adapter = {
                "apiVersion": "moelora.io/v1alpha1",
                "kind": "LoRAAdapter",
                "metadata": {"name": name, "namespace": "t"},
                "spec": {"modelServer": "srv", "source": {"uri": f"s3://bucket/{name}/"}},
            }
            api.kubectl("apply", "-f", "-", stdin=json.dumps(adapter))
        yield api


def _get(kube: KubeAPI, path: str, accept: str = TABLE) -> Any:
    request = urllib.request.Request(kube.url + path, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read().decode()
    return [json.loads(line) for line in body.splitlines()] if "watch=true" in path else json.loads(body)


def test_jsonpath_covers_what_printer_columns_use() -> None:
    obj = {"status": {"conditions": [{"type": "Failed", "reason": "X"}, {"type": "Ready", "reason": "Loaded"}]}}
    assert jsonpath(obj, '.status.conditions[?(@.type=="Ready")].reason') == ["Loaded"]
    assert jsonpath(obj, "{.status.conditions[*].type}") == ["Failed", "Ready"]
    assert jsonpath(obj, ".status.conditions[-1].reason") == ["Loaded"]
    assert jsonpath(obj, ".status.missing.deeper") == []


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(-5, "<invalid>"), (-1, "0s"), (7, "7s"), (119, "119s"), (200, "3m20s"), (600, "10m"), (4 * 3600 + 60, "4h1m"),
     (20 * 3600, "20h"), (3 * 86400 + 3600, "3d1h"), (90 * 86400, "90d"), (3 * 365 * 86400 + 86400, "3y1d")],
)  # fmt: skip
def test_ages_read_as_kubectl_writes_them(seconds: int, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_table_is_only_for_clients_that_ask() -> None:
    assert table_version({"Accept": TABLE}) == "v1"
    assert table_version({"Accept": "application/json;as=Table;v=v1beta1;g=meta.k8s.io"}) == "v1beta1"
    assert table_version({"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}) == "v1"
    assert table_version({"Accept": "application/json, */*"}) is None
    assert table_version({}) is None


def test_list_and_get_answer_tables_with_metadata_rows(kube: KubeAPI) -> None:
    table = _get(kube, LORAS)
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    names = [column["name"] for column in table["columnDefinitions"]]
    assert names == ["Name", "Server", "Phase", "Loaded", "Desired", "Rank", "Reason", "Rollup", "Age"]
    assert table["columnDefinitions"][0]["format"] == "name"
    assert table["columnDefinitions"][-1]["type"] == "date"
    assert [row["cells"][:3] for row in table["rows"]] == [["a", "srv", None], ["b", "srv", None]]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert "spec" not in table["rows"][0]["object"]

    one = _get(kube, f"{LORAS}/a?includeObject=Object")
    assert len(one["rows"]) == 1 and one["rows"][0]["object"]["spec"]["modelServer"] == "srv"
    assert "object" not in _get(kube, f"{LORAS}?includeObject=None")["rows"][0]
    assert _get(kube, LORAS, accept="application/json")["kind"] == "LoRAAdapterList"


def test_watch_events_are_one_row_tables_with_columns_only_first(kube: KubeAPI) -> None:
    events = _get(kube, f"{LORAS}?watch=true&resourceVersion=0&timeoutSeconds=1")
    assert [event["type"] for event in events] == ["ADDED", "ADDED"]
    assert all(event["object"]["kind"] == "Table" and len(event["object"]["rows"]) == 1 for event in events)
    assert events[0]["object"]["columnDefinitions"] and not events[1]["object"]["columnDefinitions"]


def test_openapi_v3_lists_documents_that_announce_strict_field_validation(kube: KubeAPI) -> None:
    paths = _get(kube, "/openapi/v3", accept="application/json")["paths"]
    assert {"apis/moelora.io/v1alpha1", "api/v1", "apis/apps/v1"} <= paths.keys()
    document = _get(kube, paths["apis/moelora.io/v1alpha1"]["serverRelativeURL"], accept="application/json")
    schemas = document["components"]["schemas"]
    server = schemas["io.moelora.v1alpha1.ModelServer"]
    assert server["x-kubernetes-group-version-kind"] == [
        {"group": "moelora.io", "version": "v1alpha1", "kind": "ModelServer"}
    ]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in schemas
    patch = document["paths"]["/apis/moelora.io/v1alpha1/namespaces/{namespace}/modelservers/{name}"]["patch"]
    assert {"name": "fieldValidation", "in": "query"}.items() <= patch["parameters"][0].items()
    core = _get(kube, "/openapi/v3/api/v1", accept="application/json")["components"]["schemas"]
    assert core["io.k8s.api.core.v1.Container"]["properties"]["ports"]["type"] == "array"
