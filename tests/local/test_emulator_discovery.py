"""The emulator answers discovery as kmock's own routes do, without kmock's DSL matching: that matching walks every
request served so far, so a long run's discovery requests (kopf makes them at each start) took seconds."""

from __future__ import annotations

import kmock
import pytest

from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.apiserver import dispatch as emulator_module

PATHS = ["/", "/api", "/api/v1", "/apis", "/apis/moelora.io", "/apis/moelora.io/v1alpha1", "/apis/apps/v1", "/version"]


def test_discovery_answers_as_kmock_routes_it_without_its_dsl(monkeypatch: pytest.MonkeyPatch) -> None:
    with KubeAPI() as kube:
        rest = Rest(url=kube.url)
        with monkeypatch.context() as patch:
            patch.setattr(emulator_module, "_discovery", lambda _request: None)  # every request through the DSL
            routed = {path: rest.request(method="GET", path=path) for path in PATHS}

        def no_dsl(*_: object) -> None:
            raise AssertionError("a discovery request reached kmock's DSL matching")

        monkeypatch.setattr(kmock.RawHandler, "_handle", no_dsl)
        direct = {path: rest.request(method="GET", path=path) for path in PATHS}
    assert direct == routed
    assert "moelora.io" in {group["name"] for group in direct["/apis"]["groups"]}
    assert "modelservers" in {resource["name"] for resource in direct["/apis/moelora.io/v1alpha1"]["resources"]}
