"""A placed ModelServer's children: a StatefulSet of stable pod names and its headless Service, valid Kubernetes."""

from __future__ import annotations

from moelora.operator.render.children import Surroundings, desired_children
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec

NOTHING_AROUND = Surroundings()


def children(settings: Settings, surroundings: Surroundings = NOTHING_AROUND, **spec: object) -> dict[str, dict]:
    rendered = desired_children(
        make_spec(**spec), name="ms", namespace="ns", settings=settings, kernel_bundle=None, surroundings=surroundings
    )
    return {f"{child['kind']}/{child['metadata']['name']}": child for child in rendered}


def test_without_placement_a_deployment_as_before(settings: Settings) -> None:
    assert {"Deployment/ms", "Service/ms"} <= set(children(settings, replicas=3))
    assert not any(key.startswith("StatefulSet") or key == "Service/ms-pods" for key in children(settings))


def test_with_placement_a_parallel_statefulset_and_its_headless_service(settings: Settings) -> None:
    rendered = children(settings, replicas=3, placement={"copies": 2})
    assert "Deployment/ms" not in rendered
    sts, headless = rendered["StatefulSet/ms"], rendered["Service/ms-pods"]
    k8s_valid(sts)
    k8s_valid(headless)
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "ms-pods"
    assert (
        headless["spec"]["clusterIP"] == "None"
        and headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    )
    assert rendered["Service/ms"]["spec"]["selector"] == headless["spec"]["selector"]  # the Service still spans all
    agent = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    assert {"name": "MOELORA_PLACEMENT", "value": "1"} in agent["env"]
    # The pod template is otherwise the Deployment's.
    deployment = children(settings, replicas=3)["Deployment/ms"]
    vllm = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    assert vllm == next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def test_a_scale_down_keeps_the_pods_assignments_still_name(settings: Settings) -> None:
    draining = Surroundings(assigned_pods=4)
    assert children(settings, draining, replicas=3, placement={})["StatefulSet/ms"]["spec"]["replicas"] == 4
    assert (
        children(settings, Surroundings(assigned_pods=2), replicas=3, placement={})["StatefulSet/ms"]["spec"][
            "replicas"
        ]
        == 3
    )
