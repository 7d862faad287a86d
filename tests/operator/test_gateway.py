"""The InferencePool, HTTPRoutes, per-pod Services and body-based router ConfigMaps of a ModelServer routed through an
inference gateway, judged by the published CRDs (tests/operator/published.py) and by the body-based router's own
contract."""

from __future__ import annotations

import copy

import pytest
import yaml

from moelora.local.apiserver import upstream
from moelora.operator.errors import SpecProblem
from moelora.operator.render import gateway
from moelora.operator.render.children import NEEDS, OPTIONAL_CHILDREN, Surroundings, desired_children
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec
from .published import problems

ROUTED = {"routing": {"gateway": {"enabled": True, "parentRefs": [{"name": "inference-gw", "namespace": "gw"}]}}}
# gateway-api-inference-extension api/v1 EndpointPickerRef and its inferencepool chart: the picker's gRPC port.
EPP_DEFAULT_PORT = 9002
# The HTTPRoute CRD's rule on spec.rules (gateway-api v1.6.1, standard channel), quoted as published.
MATCHES_RULE_MESSAGE = (
    "While 16 rules and 64 matches per rule are allowed, the total number of matches across all rules in a route "
    "must be less than 128"
)


def render_all(settings: Settings, *, name: str = "srv", assigned_pods: int = 0, **overrides: object) -> list[dict]:
    return desired_children(
        make_spec(**{**ROUTED, **overrides}),
        name=name,
        namespace="ns",
        settings=settings,
        kernel_bundle=None,
        surroundings=Surroundings(assigned_pods=assigned_pods),
    )


def render(settings: Settings, **overrides: object) -> dict[str, dict]:
    return {child["kind"]: child for child in render_all(settings, **overrides)}


HOME = {
    "routing": {"gateway": {**ROUTED["routing"]["gateway"], "routeToHome": True}},
    "placement": {"copies": 1},
}


def bbr_mapping(config_map: dict) -> dict[str, str]:
    """model name -> base model, as the body-based router's adapters store builds it from a ConfigMap
    (pkg/bbr/plugins/basemodelextractor: `baseModel` trimmed, `adapters` a YAML list of names, blanks skipped)."""
    data = config_map["data"]
    base = data["baseModel"].strip()
    adapters = [str(name).strip() for name in yaml.safe_load(data.get("adapters") or "[]") or []]
    return {base: base, **{name: base for name in adapters if name}}


def test_the_pool_selects_the_servers_pods_on_vllms_port_and_names_the_picker(settings: Settings) -> None:
    pool = render(settings)["InferencePool"]
    for release in upstream.INFERENCE_POOL_RELEASES:  # every Inference Extension release vendored stores it
        assert problems(pool, file=release) == [], release
    assert pool["spec"]["selector"] == {"matchLabels": {"moelora.io/model-server": "srv"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "srv-epp",
        "port": {"number": EPP_DEFAULT_PORT},
        "failureMode": "FailClose",
    }


def test_a_picker_of_the_users_choosing(settings: Settings) -> None:
    picker = {"serviceName": "shared-epp", "port": 9100, "failureMode": "FailOpen"}
    spec = copy.deepcopy(ROUTED)
    spec["routing"]["gateway"]["endpointPicker"] = picker
    ref = render(settings, **spec)["InferencePool"]["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"], ref["failureMode"]) == ("shared-epp", {"number": 9100}, "FailOpen")


def test_one_match_on_the_base_model_header(settings: Settings) -> None:
    route = render(settings)["HTTPRoute"]
    assert problems(route) == []
    assert route["spec"]["parentRefs"] == [{"name": "inference-gw", "namespace": "gw"}]
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "srv"}]
    assert rule["matches"] == [{"headers": [{"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": "srv"}]}]


def test_the_servers_config_map_maps_only_the_base_model(settings: Settings) -> None:
    config_map = render(settings)["ConfigMap"]
    k8s_valid(config_map)
    assert config_map["metadata"]["name"] == "srv-model-names"
    assert config_map["metadata"]["labels"]["inference.networking.k8s.io/bbr-managed"] == "true"  # BBR's selector
    assert config_map["data"] == {"baseModel": "srv"}
    served = render(settings, model={"name": "org/m", "servedName": "base"})
    assert served["ConfigMap"]["data"] == {"baseModel": "base"}
    assert served["HTTPRoute"]["spec"]["rules"][0]["matches"][0]["headers"][0]["value"] == "base"


@pytest.mark.parametrize("served", ["team-b", "team-a/support", "1", "- odd: name"])
def test_an_adapters_config_map_maps_its_name_as_bbr_reads_it(served: str) -> None:
    config_map = gateway.route_config_map(adapter="a", served=served, namespace="ns", server="srv", header="srv")
    k8s_valid(config_map)
    assert config_map["metadata"]["name"] == "a-route"
    assert config_map["metadata"]["labels"]["inference.networking.k8s.io/bbr-managed"] == "true"
    assert bbr_mapping(config_map) == {"srv": "srv", served: "srv"}  # "1" quoted, so YAML keeps it a string


def test_long_adapter_names_get_distinct_config_map_names_within_253() -> None:
    names = {gateway.route_config_map_name("a" * 250 + suffix) for suffix in ("x", "y", "")}
    assert len(names) == 3
    for name in names:
        assert len(name) <= 253 and name.endswith("-route")
        k8s_valid(
            gateway.route_config_map(adapter="a", served="a", namespace="ns", server="s", header="s")
            | {"metadata": {"name": name, "namespace": "ns"}}
        )


def test_home_routing_renders_a_service_per_pod_and_a_route_per_16_pods(settings: Settings) -> None:
    children = render_all(settings, replicas=20, **HOME)
    services = [c for c in children if c["kind"] == "Service" and c["metadata"]["name"].startswith("srv-home-")]
    routes = [c for c in children if c["kind"] == "HTTPRoute"]
    assert [s["metadata"]["name"] for s in services] == [f"srv-home-{i}" for i in range(20)]
    for service in services:
        k8s_valid(service)
        assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "home"  # not scraped (api only)
    assert services[7]["spec"]["selector"] == {
        "moelora.io/model-server": "srv",
        "statefulset.kubernetes.io/pod-name": "srv-7",
    }
    assert [r["metadata"]["name"] for r in routes] == ["srv", "srv-homes-0", "srv-homes-1"]
    for route in routes:
        assert problems(route) == [], route["metadata"]["name"]
    homes = [rule for route in routes[1:] for rule in route["spec"]["rules"]]
    assert [len(r["spec"]["rules"]) for r in routes[1:]] == [16, 4]
    for ordinal, rule in enumerate(homes):
        [match] = rule["matches"]
        assert match["headers"] == [
            {
                "type": "Exact",
                "name": "X-Gateway-Base-Model-Name",
                "value": gateway.home_header("srv", f"srv-{ordinal}"),
            }
        ]
        assert rule["backendRefs"] == [{"name": f"srv-home-{ordinal}", "port": 8000}]
    order = [c["kind"] for c in children]
    assert order.index("Service") < order.index("HTTPRoute")
    # A scale-down still draining keeps the pods, and their Services and rules, its assignments name.
    kept = render_all(settings, replicas=2, assigned_pods=3, **HOME)
    assert sum(c["kind"] == "Service" and "-home-" in c["metadata"]["name"] for c in kept) == 3


def test_home_routing_needs_service_names_within_a_dns_label(settings: Settings) -> None:
    name = "s" * 55  # <name>-home-99: 63 characters, <name>-home-100: 64
    render_all(settings, name=name, replicas=100, **HOME)
    with pytest.raises(SpecProblem) as caught:
        render_all(settings, name=name, replicas=101, **HOME)
    assert caught.value.reason == "NameTooLongForHomes"


def test_home_routing_needs_placement_to_render_homes(settings: Settings) -> None:
    unplaced = {"routing": HOME["routing"]}  # the CRD refuses it (tests/api); the render ignores it
    assert not any("-home" in c["metadata"]["name"] for c in render_all(settings, replicas=3, **unplaced))


def test_the_route_waits_for_its_config_map(settings: Settings) -> None:
    order = list(render(settings))
    assert order.index("InferencePool") < order.index("ConfigMap") < order.index("HTTPRoute")
    assert {"InferencePool", "ConfigMap"} <= NEEDS["HTTPRoute"]


def test_without_a_gateway_only_the_plain_service_routes(settings: Settings) -> None:
    children = render(settings, routing={})
    assert not {"InferencePool", "HTTPRoute", "ConfigMap"} & set(children)
    assert children["Service"]["spec"]["selector"] == {"moelora.io/model-server": "srv"}
    # So the operator deletes each once routing is turned off.
    assert OPTIONAL_CHILDREN[("v1", "ConfigMap")][1]("srv") == "srv-model-names"
    for kind in ("InferencePool", "HTTPRoute"):
        assert any(key[1] == kind for key in OPTIONAL_CHILDREN)


def test_the_service_stays_beside_the_gateway(settings: Settings) -> None:
    k8s_valid(render(settings)["Service"])


def test_the_builders_use_the_published_api_versions() -> None:
    for kind, api_version in (("InferencePool", gateway.POOL_API_VERSION), ("HTTPRoute", gateway.ROUTE_API_VERSION)):
        storage = [v for v in upstream.served_versions(upstream.PUBLISHED[kind]) if v.version == "v1"]
        assert [f"{v.group}/{v.version}" for v in storage] == [api_version]


# --- what the published CRDs refuse that the recorded facts let through --------------------------------------------


def old_style_route(settings: Settings, matches: int) -> dict:
    """A rendered route holding `matches` header matches in rules of 64, as one match per model name made them."""
    route = copy.deepcopy(render(settings)["HTTPRoute"])
    [rule] = route["spec"]["rules"]
    header = rule["matches"][0]["headers"][0]
    every = [{"headers": [{**header, "value": f"model-{index}"}]} for index in range(matches)]
    route["spec"]["rules"] = [{**rule, "matches": every[i : i + 64]} for i in range(0, matches, 64)]
    return route


def test_a_route_over_the_matches_rule_is_refused(settings: Settings) -> None:
    """The CEL rule on spec.rules sums the matches of all 16 possible rules and requires `<= 128`, though its message
    says "less than 128": 128 matches pass, 129 are refused. One model name per match, as before, passed 129 at
    128 adapters; the hand facts (64 per rule, 16 rules) let up to 1,024 through."""
    assert problems(old_style_route(settings, 127)) == []
    assert problems(old_style_route(settings, 128)) == []
    assert problems(old_style_route(settings, 129)) == [f"spec.rules: Invalid value: {MATCHES_RULE_MESSAGE}"]
    assert problems(old_style_route(settings, 1024)) == [f"spec.rules: Invalid value: {MATCHES_RULE_MESSAGE}"]


def test_two_parent_refs_to_one_gateway_need_distinct_section_names(settings: Settings) -> None:
    refs = [{"name": "gw", "namespace": "gw"}, {"name": "gw", "namespace": "gw"}]
    route = render(settings, routing={"gateway": {"enabled": True, "parentRefs": refs}})["HTTPRoute"]
    assert problems(route) == [
        "spec.parentRefs: Invalid value: sectionName must be unique when parentRefs includes 2 or more references "
        "to the same parent"
    ]
    refs = [{**refs[0], "sectionName": "a"}, {**refs[1], "sectionName": "b"}]
    assert problems(render(settings, routing={"gateway": {"enabled": True, "parentRefs": refs}})["HTTPRoute"]) == []


def test_a_service_backend_needs_a_port(settings: Settings) -> None:
    route = copy.deepcopy(render(settings)["HTTPRoute"])
    route["spec"]["rules"][0]["backendRefs"] = [{"name": "srv"}]  # group "" and kind Service by default
    assert problems(route) == ["spec.rules[0].backendRefs[0]: Invalid value: Must have port for Service reference"]


def test_a_pool_needs_distinct_target_ports_since_v1_5(settings: Settings) -> None:
    pool = copy.deepcopy(render(settings)["InferencePool"])
    pool["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8000}]
    refused = problems(pool)
    assert refused and "targetPorts" in refused[0]
    assert problems(pool, file="gie-v1.0.0-inferencepools.yaml") != []  # v1.0.0 allows one port only


def test_the_published_crds_refuse_a_broken_pool_and_route(settings: Settings) -> None:
    children = render(settings)
    broken_pool = copy.deepcopy(children["InferencePool"])
    del broken_pool["spec"]["targetPorts"]
    broken_pool["spec"]["endpointPickerRef"]["failureMode"] = "FailSoft"
    broken_pool["spec"]["endpointPickerRef"]["kind"] = "Service"
    del broken_pool["spec"]["endpointPickerRef"]["port"]
    assert problems(broken_pool) == [
        "spec.targetPorts: Required value",
        'spec.endpointPickerRef.failureMode: Unsupported value: "FailSoft": supported values: "FailOpen", "FailClose"',
        "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct "
        "the existing errors to complete validation",
    ]
    del broken_pool["spec"]["endpointPickerRef"]["failureMode"]
    broken_pool["spec"]["targetPorts"] = [{"number": 8000}]
    assert problems(broken_pool) == [
        "spec.endpointPickerRef: Invalid value: port is required when kind is 'Service' or unspecified (defaults to "
        "'Service')"
    ]
    broken_route = copy.deepcopy(children["HTTPRoute"])
    broken_route["spec"]["rules"][0]["matches"] = [
        copy.deepcopy(broken_route["spec"]["rules"][0]["matches"][0]) for _ in range(65)
    ]
    broken_route["spec"]["rules"][0]["matches"][0]["headers"][0]["type"] = "Prefix"
    assert problems(broken_route) == [
        "spec.rules[0].matches: Too many: 65: must have at most 64 items",
        'spec.rules[0].matches[0].headers[0].type: Unsupported value: "Prefix": supported values: "Exact", '
        '"RegularExpression"',
        "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct "
        "the existing errors to complete validation",
    ]
