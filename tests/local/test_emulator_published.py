"""The emulator serves other projects' kinds once declared, and refuses what their published CRDs refuse, as a real
API server with those CRDs installed would: on create and on update, with the server's 422 and words."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI, Rest

ROUTES = "/apis/gateway.networking.k8s.io/v1/namespaces/default/httproutes"
MESSAGE = (
    "While 16 rules and 64 matches per rule are allowed, the total number of matches across all rules in a route "
    "must be less than 128"
)


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI(published=("HTTPRoute", "InferencePool")) as api:
        yield api


def route(name: str, matches: int) -> dict[str, Any]:
    headers = [{"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": f"m{i}"} for i in range(matches)]
    rules = [
        {"matches": [{"headers": [h]} for h in headers[i : i + 64]], "backendRefs": [{"name": "svc", "port": 80}]}
        for i in range(0, matches, 64)
    ]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": rules},
    }


def post(url: str, path: str, body: dict[str, Any], method: str = "POST") -> tuple[int, dict[str, Any]]:
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_route_within_the_rule_is_stored_with_its_defaults(kube: KubeAPI) -> None:
    status, stored = post(kube.url, ROUTES, route("fits", 128))
    assert status < 300, stored
    parent = stored["spec"]["parentRefs"][0]
    assert (parent["group"], parent["kind"]) == ("gateway.networking.k8s.io", "Gateway")  # the CRD's defaults
    assert stored["spec"]["rules"][0]["backendRefs"][0]["weight"] == 1


def test_a_route_over_the_rule_is_refused_on_create_and_on_update(kube: KubeAPI) -> None:
    status, answer = post(kube.url, ROUTES, route("over", 129))
    assert (status, answer["reason"]) == (422, "Invalid")
    assert (
        answer["message"]
        == f'HTTPRoute.gateway.networking.k8s.io "over" is invalid: spec.rules: Invalid value: {MESSAGE}'
    )
    assert answer["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": f"Invalid value: {MESSAGE}", "field": "spec.rules"}
    ]
    assert Rest(url=kube.url).request(method="GET", path=f"{ROUTES}/over") is None  # not stored

    assert post(kube.url, ROUTES, route("grows", 64))[0] < 300
    status, answer = post(kube.url, f"{ROUTES}/grows", {"spec": route("grows", 130)["spec"]}, method="PATCH")
    assert (status, answer["details"]["causes"][0]["field"]) == (422, "spec.rules")


def test_kubectl_prints_the_servers_refusal(kube: KubeAPI) -> None:
    result = kube.kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(route("kubectl", 200)), check=False)
    assert result.returncode != 0
    assert f'The HTTPRoute "kubectl" is invalid: spec.rules: Invalid value: {MESSAGE}' in result.stderr


def test_without_the_declaration_nothing_is_checked() -> None:
    """kmock bundles an HTTPRoute resource (from K3s) and stores anything sent to it: what the emulator did before."""
    with KubeAPI() as plain:
        assert post(plain.url, ROUTES, route("over", 129))[0] < 300
