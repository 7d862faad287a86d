"""The autoscaler of a ModelServer: an HPA or a KEDA ScaledObject on the ModelServer's scale subresource."""

from __future__ import annotations

import copy

import pydantic
import pytest
from kubernetes.client.exceptions import ApiException

from moelora.api import crd
from moelora.operator.errors import SpecProblem
from moelora.operator.render import autoscaling
from moelora.operator.render.children import Surroundings, desired_children
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec
from .published import problems

# keda.sh docs, scalers/prometheus: what the prometheus trigger needs in its metadata (the CRD leaves metadata a map
# of strings; KEDA's scaler refuses the ScaledObject without these).
PROMETHEUS_TRIGGER_REQUIRED = ("serverAddress", "query", "threshold")

WAKE = 'sum(rate(gateway_requests_total{route="srv"}[2m]))'
KEDA = {
    "engine": "keda",
    "minReplicas": 0,
    "maxReplicas": 4,
    "target": {"prometheusAddress": "http://prom:9090", "wakeQuery": WAKE},
}
OWNER = {
    "apiVersion": "moelora.io/v1alpha1",
    "kind": "ModelServer",
    "metadata": {"name": "srv", "namespace": "ns", "uid": "u1"},
}


def render(settings: Settings, **overrides: object) -> dict[str, dict]:
    children = desired_children(
        make_spec(**overrides),
        name="srv",
        namespace="ns",
        settings=settings,
        kernel_bundle=None,
        surroundings=Surroundings(),
    )
    return {child["kind"]: child for child in children}


def test_the_hpa_scales_the_model_server_on_the_queue_per_replica(settings: Settings) -> None:
    hpa = render(settings, autoscaling={"minReplicas": 2, "maxReplicas": 8})["HorizontalPodAutoscaler"]
    k8s_valid(hpa)  # the whole built-in schema (autoscaling/v2), strictly
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "moelora.io/v1alpha1", "kind": "ModelServer", "name": "srv"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 8)
    assert spec["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm:num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "4"},
            },
        }
    ]


def test_the_model_server_has_the_scale_subresource_the_autoscalers_need() -> None:
    [version] = crd.model_server_crd()["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_keda_queries_prometheus_for_the_servers_queue(settings: Settings) -> None:
    children = render(settings, autoscaling=KEDA)
    assert "HorizontalPodAutoscaler" not in children  # KEDA makes its own
    scaled = children["ScaledObject"]
    assert problems(scaled) == []  # the published ScaledObject CRD stores it as rendered
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "moelora.io/v1alpha1", "kind": "ModelServer", "name": "srv"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 4)
    trigger = spec["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert set(PROMETHEUS_TRIGGER_REQUIRED) <= set(trigger["metadata"])
    assert trigger["metadata"]["query"] == 'sum(vllm:num_requests_waiting{namespace="ns",model_name="srv"})'
    assert trigger["metadata"]["threshold"] == "4"


def test_scale_to_zero_wakes_on_a_metric_that_exists_without_pods(settings: Settings) -> None:
    """KEDA scales up from zero only for an active trigger: a prometheus trigger is active when its value exceeds
    activationThreshold (default 0), and an empty result reads 0 (kedacore/keda pkg/scalers/prometheus_scaler.go).
    The queue is the pods' own series, so only the wake query can be active at zero pods; clamped to 1 against a
    threshold of 1, KEDA's HPA wants at most ceil(1 / 1) = 1 replica of it, and the queue alone scales out."""
    queue, wake = render(settings, autoscaling=KEDA)["ScaledObject"]["spec"]["triggers"]
    assert "vllm:" in queue["metadata"]["query"] and "activationThreshold" not in queue["metadata"]
    assert wake["type"] == "prometheus" and wake["name"] != queue["name"]  # KEDA wants trigger names unique
    assert wake["metadata"] == {
        "serverAddress": "http://prom:9090",
        "query": f"clamp_max(({WAKE}), 1)",
        "threshold": "1",
        "activationThreshold": "0",
    }


def test_scale_to_zero_without_a_wake_query_is_refused(settings: Settings) -> None:
    keda = copy.deepcopy(KEDA)
    del keda["target"]["wakeQuery"]
    with pytest.raises(SpecProblem) as caught:
        render(settings, autoscaling=keda)
    assert caught.value.reason == "WakeQueryMissing"
    assert "target.wakeQuery" in caught.value.message
    keda["minReplicas"] = 1  # a replica always runs: the queue is enough
    assert [t["name"] for t in render(settings, autoscaling=keda)["ScaledObject"]["spec"]["triggers"]] == ["queue"]


class Cluster:
    """The server's autoscalers as stored, with KEDA's admission webhook: a ScaledObject whose target an HPA not
    owned by a ScaledObject already scales is refused (kedacore/keda apis/keda/v1alpha1/scaledobject_webhook.go,
    "the workload ... is already managed by the hpa ...")."""

    def __init__(self, *existing: dict) -> None:
        self.objects = {(obj["kind"], obj["metadata"]["name"]): obj for obj in existing}
        self.calls: list[tuple[str, str]] = []

    def ensure(self, *, api: object, desired: dict, owner_uid: str, create: bool = True) -> tuple[dict | None, str]:
        key = (desired["kind"], desired["metadata"]["name"])
        if key not in self.objects and not create:
            return None, "absent"
        if desired["kind"] == "ScaledObject":
            for (kind, name), obj in self.objects.items():
                if (
                    kind == "HorizontalPodAutoscaler"
                    and obj["spec"]["scaleTargetRef"] == desired["spec"]["scaleTargetRef"]
                ):
                    raise ApiException(status=403, reason=f"the workload 'srv' is already managed by the hpa '{name}'")
        self.calls.append(("apply", desired["kind"]))
        self.objects[key] = desired
        return desired, "created"

    def list_owned(self, *, kind: str, labels: dict[str, str], **_: object) -> list[dict]:
        return [
            obj
            for (found, _name), obj in self.objects.items()
            if found == kind and labels.items() <= (obj["metadata"].get("labels") or {}).items()
        ]

    def delete_if_owned(self, *, kind: str, name: str, **_: object) -> bool:
        if self.objects.pop((kind, name), None) is None:
            return False
        self.calls.append(("delete", kind))
        return True


@pytest.mark.parametrize(
    ("before", "after"),
    [({"maxReplicas": 4}, KEDA), (KEDA, {"maxReplicas": 4})],
    ids=["hpa-to-keda", "keda-to-hpa"],
)
def test_switching_engines_deletes_the_old_autoscaler_first(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, before: dict, after: dict
) -> None:
    from moelora.operator.control import model_servers
    from moelora.operator.kube import apply

    old = render(settings, autoscaling=before)
    old_kind = "ScaledObject" if "ScaledObject" in old else "HorizontalPodAutoscaler"
    cluster = Cluster(old[old_kind])
    monkeypatch.setattr(apply, "ensure", cluster.ensure)
    monkeypatch.setattr(apply, "delete_if_owned", cluster.delete_if_owned)
    monkeypatch.setattr(apply, "list_owned", cluster.list_owned)
    children = list(render(settings, autoscaling=after).values())
    new_kind = ({"ScaledObject", "HorizontalPodAutoscaler"} - {old_kind}).pop()
    _, problem = model_servers.apply_children(api=None, children=children, owner=OWNER)  # type: ignore[arg-type]
    assert problem is None
    assert cluster.calls.index(("delete", old_kind)) < cluster.calls.index(("apply", new_kind))
    assert {kind for kind, _ in cluster.objects} & {"ScaledObject", "HorizontalPodAutoscaler"} == {new_kind}


def test_a_query_of_the_users_own(settings: Settings) -> None:
    keda = copy.deepcopy(KEDA)
    keda["target"]["query"] = "sum(my_queue)"
    trigger = render(settings, autoscaling=keda)["ScaledObject"]["spec"]["triggers"][0]
    assert trigger["metadata"]["query"] == "sum(my_queue)"


def test_keda_without_prometheus_is_refused(settings: Settings) -> None:
    with pytest.raises(SpecProblem) as caught:
        render(settings, autoscaling={"engine": "keda", "maxReplicas": 2})
    assert caught.value.reason == "PrometheusAddressMissing"


def test_without_autoscaling_nothing_is_rendered(settings: Settings) -> None:
    children = render(settings)
    assert not {"HorizontalPodAutoscaler", "ScaledObject"} & set(children)


def test_the_workload_follows_spec_replicas_which_the_autoscaler_writes(settings: Settings) -> None:
    children = render(settings, replicas=5, autoscaling={"maxReplicas": 8})
    assert children["Deployment"]["spec"]["replicas"] == 5


def test_max_replicas_is_required() -> None:
    with pytest.raises(pydantic.ValidationError):
        make_spec(autoscaling={"minReplicas": 1})


def test_the_crd_rules_guard_the_bounds_and_keda() -> None:
    schema = crd.model_server_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = {
        rule["rule"] for rule in schema["properties"]["spec"]["properties"]["autoscaling"]["x-kubernetes-validations"]
    }
    assert "self.maxReplicas >= self.minReplicas" in rules
    assert "self.engine == 'keda' || self.minReplicas >= 1" in rules


def test_a_broken_hpa_and_scaled_object_are_refused(settings: Settings) -> None:
    hpa = render(settings, autoscaling={"maxReplicas": 8})["HorizontalPodAutoscaler"]
    broken = copy.deepcopy(hpa)
    broken["spec"]["metrics"][0]["type"] = "Queue"
    del broken["spec"]["maxReplicas"]
    with pytest.raises(Exception, match="Queue|maxReplicas"):
        k8s_valid(broken)
    scaled = copy.deepcopy(render(settings, autoscaling=KEDA)["ScaledObject"])
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 4
    del scaled["spec"]["scaleTargetRef"]
    assert problems(scaled) == [
        "spec.scaleTargetRef: Required value",
        'spec.triggers[0].metadata[threshold]: Invalid value: "integer": spec.triggers[0].metadata[threshold] in body '
        'must be of type string: "integer"',
        "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct "
        "the existing errors to complete validation",
    ]


def test_the_published_crd_holds_min_replicas_to_max(settings: Settings) -> None:
    """KEDA's CEL rule on spec (`!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) ?
    self.maxReplicaCount : 100)`), which the recorded facts never had; our CRD's own rule
    `self.maxReplicas >= self.minReplicas` (above) keeps what we render within it."""
    scaled = copy.deepcopy(render(settings, autoscaling=KEDA)["ScaledObject"])
    scaled["spec"]["minReplicaCount"] = 5
    assert problems(scaled) == ["spec: Invalid value: minReplicaCount must be less than or equal to maxReplicaCount"]
    del scaled["spec"]["maxReplicaCount"]
    scaled["spec"]["minReplicaCount"] = 101
    assert problems(scaled) == ["spec: Invalid value: minReplicaCount must be less than or equal to maxReplicaCount"]


def test_the_builders_use_the_published_api_versions() -> None:
    from moelora.local.apiserver import upstream

    [served] = upstream.served_versions(upstream.PUBLISHED["ScaledObject"])
    assert autoscaling.KEDA_API_VERSION == f"{served.group}/{served.version}"
    assert autoscaling.HPA_API_VERSION == "autoscaling/v2"  # kubernetes-validate checks the HPA as this version
