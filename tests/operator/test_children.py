"""The objects a ModelServer owns, rendered from its spec and what was observed, without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from moelora.operator.errors import SpecProblem
from moelora.operator.render.children import OPTIONAL_CHILDREN, Surroundings, desired_children
from moelora.operator.settings import Settings

from .conftest import make_spec

WITH_SECRET = {"s3": {"credentialsSecret": {"name": "s3-creds"}}}


def kinds(children: list[dict]) -> list[str]:
    return [child["kind"] for child in children]


def render(spec_overrides: dict, surroundings: Surroundings, settings: Settings) -> list[dict]:
    return desired_children(
        make_spec(**spec_overrides),
        name="srv",
        namespace="ns",
        settings=settings,
        kernel_bundle=None,
        surroundings=surroundings,
    )


def test_one_replica_owns_a_deployment_and_a_service(settings: Settings) -> None:
    assert kinds(render({}, Surroundings(), settings)) == ["Deployment", "Service"]


def test_two_replicas_add_a_disruption_budget(settings: Settings) -> None:
    children = render({"replicas": 2}, Surroundings(), settings)
    assert kinds(children) == ["Deployment", "Service", "PodDisruptionBudget"]
    assert ("policy/v1", "PodDisruptionBudget") in OPTIONAL_CHILDREN


def test_a_missing_credentials_secret_is_refused(settings: Settings) -> None:
    with pytest.raises(SpecProblem) as problem:
        render(WITH_SECRET, Surroundings(secrets_exist={"s3-creds": False}), settings)
    assert problem.value.reason == "SecretNotFound"


def test_an_unreadable_credentials_secret_is_not_judged(settings: Settings) -> None:
    # None: the operator may not read Secrets there, so the pods' own SecretNotFound tells instead.
    assert kinds(render(WITH_SECRET, Surroundings(secrets_exist={"s3-creds": None}), settings))[0] == "Deployment"


def test_a_missing_kernel_config_map_is_refused(settings: Settings) -> None:
    spec = {"kernels": {"configs": "configMap", "configMapName": "tuned"}}
    with pytest.raises(SpecProblem) as problem:
        render(spec, Surroundings(kernel_config_map=None), settings)
    assert problem.value.reason == "ConfigMapNotFound"
    children = render(spec, Surroundings(kernel_config_map={"data": {"a.json": "{}"}}), settings)
    assert kinds(children) == ["Deployment", "Service"]


def test_a_missing_token_secret_is_refused_naming_what_needs_it(settings: Settings) -> None:
    spec = {"model": {"name": "org/gated", "tokenSecret": {"name": "hf"}}}
    with pytest.raises(SpecProblem) as problem:
        render(spec, Surroundings(secrets_exist={"hf": False}), settings)
    assert problem.value.reason == "SecretNotFound" and "Hugging Face token" in problem.value.message
    assert kinds(render(spec, Surroundings(secrets_exist={"hf": True}), settings))[0] == "Deployment"


def test_a_missing_api_key_secret_is_refused(settings: Settings) -> None:
    with pytest.raises(SpecProblem) as problem:
        render({"apiKeySecret": {"name": "client-key"}}, Surroundings(secrets_exist={"client-key": False}), settings)
    assert problem.value.reason == "SecretNotFound" and "client API key" in problem.value.message


def test_adapter_secrets_become_a_role_on_exactly_those_names(settings: Settings) -> None:
    from .conftest import k8s_valid

    surroundings = Surroundings(adapter_secrets=frozenset({"team-b", "team-a"}))
    children = render({"replicas": 2}, surroundings, settings)
    assert kinds(children) == ["Deployment", "Service", "PodDisruptionBudget", "Role", "RoleBinding"]
    role, binding = children[-2:]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["team-a", "team-b"]}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": settings.server_service_account, "namespace": "ns"}
    ]
    for obj in (role, binding):
        k8s_valid(obj)
    assert ("rbac.authorization.k8s.io/v1", "Role") in OPTIONAL_CHILDREN


def test_children_come_after_what_they_need(settings: Settings) -> None:
    from moelora.operator.render.children import NEEDS

    everything = {
        "replicas": 2,
        "nodes": 2,
        "routing": {"gateway": {"enabled": True, "parentRefs": [{"name": "gw"}]}},
        "autoscaling": {"maxReplicas": 3},
    }
    for overrides in ({"replicas": 2}, everything):
        children = render(overrides, Surroundings(adapter_secrets=frozenset({"s"})), settings)
        # The body-based router's ConfigMap is the routing's: only the HTTPRoute, after it, depends on it.
        routing_map = [i for i, c in enumerate(children) if c["metadata"]["name"].endswith("-model-names")]
        order = [kind for i, kind in enumerate(kinds(children)) if i not in routing_map]
        for kind, needs in NEEDS.items():
            if kind in order:
                assert all(order.index(need) < order.index(kind) for need in needs if need in order), kind
        if routing_map:
            assert kinds(children).index("InferencePool") < routing_map[0] < kinds(children).index("HTTPRoute")
    assert {"LeaderWorkerSet", "InferencePool", "HTTPRoute", "HorizontalPodAutoscaler"} <= set(order)


def test_policy_is_judged_before_anything_renders(settings: Settings) -> None:
    with pytest.raises(SpecProblem) as problem:
        render({"image": "evil.example.com/x:1"}, Surroundings(), settings)
    assert problem.value.reason == "ImageNotAllowed"
    with pytest.raises(SpecProblem) as problem:
        render({"serviceAccountName": "default"}, Surroundings(), settings)
    assert problem.value.reason == "ServiceAccountNotAllowed"


@pytest.mark.parametrize(
    ("spec", "claim", "needed_by"),
    [
        ({"kernels": {"compileCache": {"claimName": "compiled"}}}, "compiled", "kernels.compileCache"),
        ({"model": {"name": "org/m", "source": "pvc://weights/m"}}, "weights", "model.source"),
    ],
)
def test_a_missing_claim_is_refused_naming_what_needs_it(
    settings: Settings, spec: dict[str, Any], claim: str, needed_by: str
) -> None:
    with pytest.raises(SpecProblem) as problem:
        render(spec, Surroundings(claims_exist={claim: False}), settings)
    assert problem.value.reason == "ClaimNotFound"
    assert needed_by in problem.value.message and repr(claim) in problem.value.message
    for known in (True, None):  # None: the operator may not read claims there; the pods' events tell instead
        assert kinds(render(spec, Surroundings(claims_exist={claim: known}), settings))[0] == "Deployment"
