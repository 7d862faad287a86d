"""The InferencePool and HTTPRoute of a ModelServer routed through an inference gateway."""

from __future__ import annotations

import copy

import pytest

from moelora.operator import gateway
from moelora.operator.children import OPTIONAL_CHILDREN, Surroundings, desired_children
from moelora.operator.errors import SpecProblem
from moelora.operator.settings import Settings

from . import published_schemas as facts
from .conftest import k8s_valid, make_spec
from .schema_check import problems

ROUTED = {"routing": {"gateway": {"enabled": True, "parentRefs": [{"name": "inference-gw", "namespace": "gw"}]}}}


def render(settings: Settings, adapters: frozenset[str] = frozenset(), **overrides: object) -> dict[str, dict]:
    children = desired_children(
        make_spec(**{**ROUTED, **overrides}),
        name="srv",
        namespace="ns",
        settings=settings,
        kernel_bundle=None,
        surroundings=Surroundings(served_adapters=adapters),
    )
    return {child["kind"]: child for child in children}


def test_the_pool_selects_the_servers_pods_on_vllms_port_and_names_the_picker(settings: Settings) -> None:
    pool = render(settings)["InferencePool"]
    assert problems(pool, facts.INFERENCE_POOL) == []
    assert pool["spec"]["selector"] == {"matchLabels": {"moelora.io/model-server": "srv"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "srv-epp",
        "port": {"number": facts.EPP_DEFAULT_PORT},
        "failureMode": "FailClose",
    }


def test_a_picker_of_the_users_choosing(settings: Settings) -> None:
    picker = {"serviceName": "shared-epp", "port": 9100, "failureMode": "FailOpen"}
    spec = copy.deepcopy(ROUTED)
    spec["routing"]["gateway"]["endpointPicker"] = picker
    ref = render(settings, **spec)["InferencePool"]["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"], ref["failureMode"]) == ("shared-epp", {"number": 9100}, "FailOpen")


def test_the_route_matches_the_base_model_and_every_adapter_by_the_bbr_header(settings: Settings) -> None:
    route = render(settings, adapters=frozenset({"team-b", "team-a"}))["HTTPRoute"]
    assert problems(route, facts.HTTP_ROUTE) == []
    assert route["spec"]["parentRefs"] == [{"name": "inference-gw", "namespace": "gw"}]
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "srv"}]
    headers = [match["headers"] for match in rule["matches"]]
    assert headers == [
        [{"type": "Exact", "name": facts.BBR_MODEL_HEADER, "value": model}] for model in ("srv", "team-a", "team-b")
    ]


def test_the_base_models_served_name_is_matched_once(settings: Settings) -> None:
    route = render(settings, adapters=frozenset({"base"}), model={"name": "org/m", "servedName": "base"})["HTTPRoute"]
    values = [m["headers"][0]["value"] for m in route["spec"]["rules"][0]["matches"]]
    assert values == ["base"]


def test_many_adapters_spread_over_rules_within_the_routes_limits(settings: Settings) -> None:
    adapters = frozenset(f"adapter-{index:03}" for index in range(200))
    route = render(settings, adapters=adapters)["HTTPRoute"]
    assert problems(route, facts.HTTP_ROUTE) == []
    assert [len(rule["matches"]) for rule in route["spec"]["rules"]] == [64, 64, 64, 9]


def test_more_names_than_one_route_holds_are_refused(settings: Settings) -> None:
    adapters = frozenset(f"a{index}" for index in range(64 * 16))
    with pytest.raises(SpecProblem) as caught:
        render(settings, adapters=adapters)
    assert caught.value.reason == "TooManyModelNames"


def test_without_a_gateway_only_the_plain_service_routes(settings: Settings) -> None:
    children = render(settings, routing={})
    assert "InferencePool" not in children and "HTTPRoute" not in children
    assert children["Service"]["spec"]["selector"] == {"moelora.io/model-server": "srv"}
    for kind in ("InferencePool", "HTTPRoute"):
        assert any(key[1] == kind for key in OPTIONAL_CHILDREN)  # so the operator deletes them once turned off


def test_the_service_stays_beside_the_gateway(settings: Settings) -> None:
    service = render(settings)["Service"]
    k8s_valid(service)


def test_the_builders_use_the_recorded_contracts() -> None:
    assert gateway.MODEL_HEADER == facts.BBR_MODEL_HEADER
    assert gateway.POOL_API_VERSION == facts.INFERENCE_POOL["properties"]["apiVersion"]["enum"][0]
    assert gateway.ROUTE_API_VERSION == facts.HTTP_ROUTE["properties"]["apiVersion"]["enum"][0]


def test_the_checker_catches_broken_pools_and_routes(settings: Settings) -> None:
    children = render(settings)
    pool, route = children["InferencePool"], children["HTTPRoute"]
    broken_pool = copy.deepcopy(pool)
    del broken_pool["spec"]["targetPorts"]
    broken_pool["spec"]["endpointPickerRef"]["failureMode"] = "FailSoft"
    assert problems(broken_pool, facts.INFERENCE_POOL) == [
        ".spec: targetPorts is required",
        ".spec.endpointPickerRef.failureMode: 'FailSoft' is not one of ['FailOpen', 'FailClose']",
    ]
    broken_route = copy.deepcopy(route)
    broken_route["spec"]["rules"][0]["matches"][0]["headers"][0]["type"] = "Prefix"
    broken_route["spec"]["rules"][0]["matches"] *= 65
    found = problems(broken_route, facts.HTTP_ROUTE)
    assert ".spec.rules[0].matches: more than 64 items" in found
    assert any("'Prefix' is not one of" in problem for problem in found)


def test_the_adapter_index_gives_the_served_names_of_all_but_failed_adapters() -> None:
    from moelora.operator import indexes

    def entry(name: str, served: str | None, phase: str) -> indexes.AdapterEntry:
        spec = {"modelServer": "srv", **({"servedName": served} if served else {})}
        [value] = indexes.adapters_index(spec=spec, status={"phase": phase}, name=name, namespace="ns").values()
        return value

    entries = [entry("a", "team-a/support", "Loaded"), entry("b", None, "Pending"), entry("c", None, "Failed")]
    assert indexes.served_adapters(entries) == {"team-a/support", "b"}
