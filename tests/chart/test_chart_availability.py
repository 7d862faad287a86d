"""The operator's availability objects: its PodDisruptionBudget (only with several replicas), its readiness probe
(kopf's health endpoint, asked of the real operator on every replica, a paused standby included), and Chart.yaml's
kubeVersion floor, which must be the release where everything the chart ships is served by default.
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.request
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from moelora.local.operator_thread import OperatorThread
from moelora.operator.settings import Settings

from .test_chart import CHART, KUBE_VERSIONS, NAMESPACE, chart
from .test_chart_operator import SERVING, own_liveness_port, render, stack, wait_for

HA = {"operator": {"replicas": 2}}
HA_NAMESPACED = {"operator": {"replicas": 3}, "watchNamespaces": ["ml-a", "ml-b"]}


def budgets(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == "PodDisruptionBudget"]


def operator_deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = [obj for obj in objects if obj["kind"] == "Deployment"]
    return deployment


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return operator_deployment(objects)["spec"]["template"]["spec"]["containers"][0]


# --- the operator's PodDisruptionBudget ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {},
        # Peering asked for with one replica: still one pod, so still no budget.
        {"operator": {"peering": {"enabled": True}}},
        {"operator": {"replicas": 2, "podDisruptionBudget": {"enabled": False}}},
    ],
    ids=["defaults", "one-replica-with-peering", "turned-off"],
)
def test_no_budget_unless_several_replicas_and_enabled(values: dict[str, Any]) -> None:
    assert budgets(render(values)) == []


@pytest.mark.parametrize("values", [HA, HA_NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_several_replicas_get_a_budget_that_never_blocks_a_drain(values: dict[str, Any]) -> None:
    objects = render(values)
    [budget] = budgets(objects)
    deployment = operator_deployment(objects)
    assert budget["metadata"]["name"] == "moelora-operator"
    assert budget["metadata"]["namespace"] == NAMESPACE
    # It selects exactly the operator's pods: the Deployment's own selector, which its pod template carries.
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(budget, version, strict=True)


def test_max_unavailable_is_the_value() -> None:
    [budget] = budgets(render({"operator": {"replicas": 4, "podDisruptionBudget": {"maxUnavailable": 2}}}))
    assert budget["spec"]["maxUnavailable"] == 2
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(budget, version, strict=True)


@pytest.mark.parametrize(
    ("budget", "error"),
    [
        ({"maxUnavailable": 0}, "minimum"),  # a budget of 0 would block every drain of the operator's nodes
        ({"maxUnavailable": "50%"}, "integer"),
        ({"minAvailable": 1}, "additional properties"),
    ],
)
def test_schema_refuses_a_budget_that_blocks_drains_or_is_misspelt(budget: dict[str, Any], error: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=error):
        chart().render({"operator": {"replicas": 2, "podDisruptionBudget": budget}}, name="moelora", namespace="x")


# --- the readiness probe ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, HA_NAMESPACED], ids=["defaults", "namespaced-ha"])
def test_both_probes_ask_the_endpoint_the_operator_serves(values: dict[str, Any]) -> None:
    container = operator_container(render(values))
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # Parsed the operator's own way: what it will serve.
    endpoint = urllib.parse.urlsplit(Settings.from_env(env).liveness_endpoint or "")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], ports[get["port"]]) == (endpoint.path, endpoint.port), probe
    # Readiness is asked more often than liveness: a replica counts as ready soon after it starts.
    assert container["readinessProbe"]["periodSeconds"] < container["livenessProbe"]["periodSeconds"]


def status_of(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - a loopback URL of the test's own
        return int(response.status)


def test_every_replica_answers_the_probes_the_standby_too() -> None:
    """Two replicas as the chart runs them (peering, RBAC enforced): one works, the other is paused by kopf, and
    both answer the probe's path with 200, so both count as ready (to the rollout, to the budget)."""
    values = {"watchNamespaces": [SERVING], **HA}
    objects = render(values)
    probe = operator_container(objects)["readinessProbe"]["httpGet"]
    with stack(values, operators=0) as (api, emulator, _, settings):
        replicas = [own_liveness_port(settings) for _ in range(2)]
        with OperatorThread(settings=replicas[0]), OperatorThread(settings=replicas[1]):
            wait_for(
                lambda: len((api.get("kopf.dev/v1/kopfpeerings", SERVING, "moelora") or {}).get("status") or {}) == 2,
                what="keep-alives of both replicas",
            )
            for replica in replicas:
                parts = urllib.parse.urlsplit(replica.liveness_endpoint or "")
                assert parts.path == probe["path"]
                assert status_of(replica.liveness_endpoint or "") == 200
        assert emulator.denied == []


# --- kubeVersion ----------------------------------------------------------------------------------------------

# The first release serving each feature by default (beta or GA), with where it is found in what the chart ships.
FEATURE_RELEASES = {
    "CRD selectableFields (CustomResourceFieldSelectors)": (1, 31),
    "CRD x-kubernetes-validations with reason or fieldPath": (1, 28),
    "PodDisruptionBudget unhealthyPodEvictionPolicy": (1, 27),
}


def validation_rules(node: Any) -> list[dict[str, Any]]:
    """Every x-kubernetes-validations rule under `node`."""
    if isinstance(node, list):
        return [rule for item in node for rule in validation_rules(item)]
    if not isinstance(node, dict):
        return []
    own = list(node.get("x-kubernetes-validations") or [])
    return own + [
        rule for key, value in node.items() if key != "x-kubernetes-validations" for rule in validation_rules(value)
    ]


def features_used(objects: list[dict[str, Any]]) -> set[str]:
    found = set()
    for obj in objects:
        if obj["kind"] == "CustomResourceDefinition":
            for version in obj["spec"]["versions"]:
                if version.get("selectableFields"):
                    found.add("CRD selectableFields (CustomResourceFieldSelectors)")
            if any("reason" in rule or "fieldPath" in rule for rule in validation_rules(obj)):
                found.add("CRD x-kubernetes-validations with reason or fieldPath")
        if obj["kind"] == "PodDisruptionBudget" and "unhealthyPodEvictionPolicy" in obj["spec"]:
            found.add("PodDisruptionBudget unhealthyPodEvictionPolicy")
    return found


def test_kube_version_floor_is_the_newest_feature_the_chart_ships() -> None:
    chart_yaml = (CHART / "Chart.yaml").read_text()
    floor = re.search(r'^kubeVersion: ">=(\d+)\.(\d+)\.0-0"$', chart_yaml, flags=re.MULTILINE)
    assert floor, "kubeVersion is a single lower bound"
    used = features_used(render(HA))
    assert used == set(FEATURE_RELEASES)
    assert (int(floor.group(1)), int(floor.group(2))) == max(FEATURE_RELEASES[feature] for feature in used)
    # The comment above it names that release and that feature, and the oldest schemas the tests validate with are it.
    comment = chart_yaml[: floor.start()].rsplit("appVersion", 1)[1]
    assert comment.splitlines()[1].startswith(f"# {floor.group(1)}.{floor.group(2)}: ")
    assert "selectableFields" in comment
    assert KUBE_VERSIONS[0] == f"{floor.group(1)}.{floor.group(2)}.0"
