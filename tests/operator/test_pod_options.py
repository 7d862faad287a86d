"""Pod knobs (labels, annotations, pull Secrets, priority, spread, ServiceAccount) and Secret-backed env."""

from __future__ import annotations

import json
from typing import Any

import pytest

from moelora.operator.errors import SpecProblem
from moelora.operator.render import deployment as dep
from moelora.operator.render import engine
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec


def render(settings: Settings, **spec: Any) -> dict[str, Any]:
    obj = dep.deployment(make_spec(**spec), name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    return obj


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def refused(settings: Settings, **spec: Any) -> SpecProblem:
    with pytest.raises(SpecProblem) as caught:
        dep.deployment(make_spec(**spec), name="srv", namespace="ns", settings=settings)
    return caught.value


# --- pod knobs ---------------------------------------------------------------------------------------------------


def test_pod_knobs_are_rendered(settings: Settings) -> None:
    spread = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    own_selector = {**spread, "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}}
    obj = render(
        settings,
        imagePullSecrets=[{"name": "regcred"}],
        priorityClassName="serving-high",
        podLabels={"team": "search", "cost-center": "42"},
        podAnnotations={"example.com/owner": "search"},
        topologySpreadConstraints=[spread, own_selector],
        serviceAccountName="search-irsa",
    )
    template = obj["spec"]["template"]
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "serving-high"
    assert pod["serviceAccountName"] == "search-irsa"
    # A constraint without a selector counts this server's pods; one with its own keeps it.
    assert pod["topologySpreadConstraints"] == [
        {**spread, "labelSelector": {"matchLabels": {"moelora.io/model-server": "srv"}}},
        own_selector,
    ]
    assert template["metadata"]["labels"]["team"] == "search"
    assert template["metadata"]["labels"]["moelora.io/model-server"] == "srv"
    assert template["metadata"]["annotations"] == {"example.com/owner": "search"}
    assert obj["spec"]["selector"]["matchLabels"] == {"moelora.io/model-server": "srv"}


def test_defaults_render_no_knobs(settings: Settings) -> None:
    obj = render(settings)
    pod = obj["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "moelora-server"  # the operator's configured server account
    for absent in ("imagePullSecrets", "priorityClassName", "topologySpreadConstraints"):
        assert absent not in pod
    assert "annotations" not in obj["spec"]["template"]["metadata"]


@pytest.mark.parametrize(
    "label", ["moelora.io/model-server", "app.kubernetes.io/instance", "app.kubernetes.io/name", "pod-template-hash"]
)
def test_moelora_labels_cannot_be_overridden(settings: Settings, label: str) -> None:
    problem = refused(settings, podLabels={label: "other"})
    assert problem.reason == "ReservedPodLabel" and label in problem.message


def test_moelora_annotations_cannot_be_set(settings: Settings) -> None:
    problem = refused(settings, podAnnotations={"moelora.io/kernel-configs-hash": "fake"})
    assert problem.reason == "ReservedPodAnnotation"


@pytest.mark.parametrize(
    "constraint",
    [
        {"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 0, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "Sometimes"},
    ],
)
def test_unusable_topology_spread_is_refused(settings: Settings, constraint: dict[str, Any]) -> None:
    assert refused(settings, topologySpreadConstraints=[constraint]).reason == "InvalidTopologySpread"


# --- env from Secrets, ConfigMaps and the downward API --------------------------------------------------------------


def test_env_value_from_and_env_from_are_rendered_as_given(settings: Settings) -> None:
    env = [
        {"name": "LITERAL", "value": "1"},
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api", "optional": True}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "mode"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ]
    env_from = [{"secretRef": {"name": "more"}}, {"configMapRef": {"name": "tuning"}, "prefix": "T_"}]
    vllm = container(render(settings, env=env, envFrom=env_from, gpus=0), "vllm")
    assert vllm["env"][-len(env) :] == env
    assert vllm["envFrom"] == env_from
    assert "envFrom" not in container(render(settings), "vllm")


def test_an_empty_env_value_is_rendered_as_the_api_server_stores_it(settings: Settings) -> None:
    vllm = container(render(settings, env=[{"name": "EMPTY", "value": ""}, {"name": "BARE"}]), "vllm")
    assert vllm["env"][-2:] == [{"name": "EMPTY"}, {"name": "BARE"}]  # defined and empty, without a "" to drop


def test_home_is_managed(settings: Settings) -> None:
    assert refused(settings, env=[{"name": "HOME", "value": "/"}]).reason == "ManagedEnvVar"


def test_required_secrets_are_every_non_optional_reference() -> None:
    spec = make_spec(
        model={"name": "org/gated", "tokenSecret": {"name": "hf"}},
        s3={"credentialsSecret": {"name": "aws"}},
        env=[
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "a", "key": "k"}}},
            {"name": "B", "valueFrom": {"secretKeyRef": {"name": "b", "key": "k", "optional": True}}},
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        ],
        envFrom=[{"secretRef": {"name": "d"}}, {"secretRef": {"name": "e", "optional": True}}],
    )
    assert [name for name, _ in engine.required_secrets(spec)] == ["aws", "hf", "a", "d"]


# --- a gated model's token -------------------------------------------------------------------------------------


def test_the_token_is_a_secret_key_ref_and_never_a_literal(settings: Settings) -> None:
    obj = render(settings, model={"name": "meta-llama/gated-moe", "tokenSecret": {"name": "hf-token", "key": "token"}})
    vllm = container(obj, "vllm")
    [token] = [var for var in vllm["env"] if var["name"] == "HF_TOKEN"]
    assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    every_var = [
        var
        for c in [
            *obj["spec"]["template"]["spec"].get("initContainers", []),
            *obj["spec"]["template"]["spec"]["containers"],
        ]
        for var in c["env"]
    ]
    assert all("value" not in var for var in every_var if "TOKEN" in var["name"])
    assert "HF_TOKEN" not in {var["name"] for var in container(obj, "agent")["env"]}  # the agent never needs it
    assert '"value": "hf_' not in json.dumps(obj)


def test_the_token_variable_is_managed_only_with_a_token_secret(settings: Settings) -> None:
    by_ref = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "t"}}}]
    assert container(render(settings, env=by_ref), "vllm")["env"][-1] == by_ref[0]
    problem = refused(settings, model={"name": "org/m", "tokenSecret": {"name": "hf"}}, env=by_ref)
    assert problem.reason == "ManagedEnvVar" and "HF_TOKEN" in problem.message
