"""Safe to share, through the real kopf operator against the emulated API server: a ModelServer writes only what it
owns, runs only allowed images and ServiceAccounts, grants its pods only the Secrets its adapters name, its adapters
read only allowed S3 sources, and it carries no finalizer.

The emulator collects garbage like a real API server (an object goes with the last owner its ownerReferences name);
the ownership tests also assert the cause directly: no ownerReference to the ModelServer on the foreign object.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread

from .cluster import DEPLOYMENTS, LORA, MS, apply, condition, manifest, wait_for
from .conftest import running_operator

ROLES = "rbac.authorization.k8s.io/v1/roles"
ROLE_BINDINGS = "rbac.authorization.k8s.io/v1/rolebindings"


# The platform's policy: the images, service accounts and S3 endpoints tenants may name.
POLICY = {
    "resync_seconds": 1.0,
    "allowed_images": ("example.com/server:*",),
    "allowed_service_accounts": ("team-a-server",),
    "allowed_s3_endpoints": ("https://s3.team-b.example.com",),
}


@pytest.fixture(scope="module")
def operator(kube: KubeAPI) -> Iterator[OperatorThread]:
    with running_operator(kube, **POLICY) as running:
        yield running


def server(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    obj = manifest("modelserver.yaml", namespace=namespace, **spec)
    obj["metadata"]["name"] = name
    return obj


def adapter(namespace: str, name: str, **source: Any) -> dict[str, Any]:
    obj = manifest("loraadapter.yaml", namespace=namespace)
    obj["metadata"]["name"] = name
    obj["spec"]["source"].update(source)
    return obj


def degraded_reason(kube: KubeAPI, namespace: str, name: str) -> str | None:
    cond = condition(kube.get(MS, namespace, name), "Degraded")
    return cond["reason"] if cond and cond["status"] == "True" else None


def warnings(kube: KubeAPI, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        event
        for event in kube.list("v1/events", namespace)
        if event.get("involvedObject", {}).get("name") == name and event["reason"] == reason
    ]


def foreign_service(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "shop"}},
        "spec": {"selector": {"app": "shop"}, "ports": [{"name": "web", "port": 80, "targetPort": 8080}]},
    }


def ms_row(kube: KubeAPI, namespace: str, name: str) -> dict[str, str]:
    """`kubectl get ms`'s row as {column: cell}."""
    header, row = kube.kubectl("get", "ms", name, "-n", namespace).stdout.splitlines()
    return dict(zip(header.split(), row.split(), strict=True))


def test_a_foreign_service_is_never_taken_over(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "owner-svc"
    apply(kube, foreign_service(ns, "shop"))
    before = kube.get("v1/services", ns, "shop")
    apply(kube, server(ns, "shop"))
    wait_for(lambda: degraded_reason(kube, ns, "shop") == "NameTaken" or None, what="NameTaken")
    ms = kube.get(MS, ns, "shop")
    assert condition(ms, "Degraded")["message"] == "Service shop exists and is not owned by ModelServer shop"
    [event] = wait_for(lambda: warnings(kube, ns, "shop", "NameTaken"), what="the Warning Event")
    assert event["type"] == "Warning"
    # What the server shows says so: Ready's reason (kubectl's STATUS column), and no endpoint naming their Service.
    ready = condition(ms, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameTaken") and ms_row(kube, ns, "shop")["STATUS"] == (
        "NameTaken"
    )
    assert "endpoint" not in ms["status"]
    time.sleep(1.5)  # a resync later: nothing created for a spec that is not applied
    assert kube.list(DEPLOYMENTS, ns) == [] and kube.list("policy/v1/poddisruptionbudgets", ns) == []
    assert kube.get("v1/services", ns, "shop") == before  # byte for byte, resourceVersion included

    kube.kubectl("delete", "ms", "shop", "-n", ns, "--wait=true", "--timeout=20s")
    after = kube.get("v1/services", ns, "shop")
    assert after == before
    assert not after["metadata"].get("ownerReferences")  # what would make a real garbage collector delete it


def owned(obj: dict[str, Any] | None, owner: dict[str, Any]) -> bool:
    return obj is not None and obj["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]


def test_a_freed_name_lets_the_server_start(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "owner-svc-freed"
    apply(kube, foreign_service(ns, "shop"))
    apply(kube, server(ns, "shop"))
    wait_for(lambda: degraded_reason(kube, ns, "shop") == "NameTaken" or None, what="NameTaken")
    kube.kubectl("delete", "service", "shop", "-n", ns)
    deployment = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "shop"), what="the Deployment, at the next resync")
    ms = wait_for(
        lambda: (m := kube.get(MS, ns, "shop")) and (m.get("status") or {}).get("endpoint") and m, what="the endpoint"
    )
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == ms["metadata"]["uid"]
    assert condition(ms, "Ready")["reason"] != "NameTaken" and degraded_reason(kube, ns, "shop") is None
    assert owned(kube.get("v1/services", ns, "shop"), ms)


def test_a_foreign_deployment_holds_back_what_serves_it(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "owner-dep"
    foreign = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "shop"}},
            "template": {
                "metadata": {"labels": {"app": "shop"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }
    apply(kube, foreign)
    ready = {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1}
    kube.kubectl(
        "patch",
        "deployment",
        "shop",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": ready}),
    )
    before = kube.get(DEPLOYMENTS, ns, "shop")
    apply(kube, server(ns, "shop", replicas=2))
    wait_for(lambda: degraded_reason(kube, ns, "shop") == "NameTaken" or None, what="NameTaken")
    ms = kube.get(MS, ns, "shop")
    assert "Deployment shop exists and is not owned by ModelServer shop" in condition(ms, "Degraded")["message"]
    assert kube.get(DEPLOYMENTS, ns, "shop") == before
    # Its Service and budget would serve or guard pods that are not ours: not created. Nor is its readiness ours.
    assert kube.get("v1/services", ns, "shop") is None
    assert kube.get("policy/v1/poddisruptionbudgets", ns, "shop") is None
    assert condition(ms, "Ready")["status"] == "False" and ms["status"]["readyReplicas"] == 0
    assert condition(ms, "Ready")["reason"] == "NameTaken" and "endpoint" not in ms["status"]


def test_no_finalizer_so_deleting_while_the_operator_is_down_completes(kube: KubeAPI) -> None:
    ns = "no-finalizer"
    with running_operator(kube, **POLICY):
        apply(kube, server(ns, "qwen-moe"))
        wait_for(lambda: (kube.get(MS, ns, "qwen-moe").get("status") or {}).get("endpoint"), what="reconciled")
        wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment")
    assert not kube.get(MS, ns, "qwen-moe")["metadata"].get("finalizers")
    kube.kubectl("delete", "ms", "qwen-moe", "-n", ns, "--wait=true", "--timeout=10s")
    assert kube.get(MS, ns, "qwen-moe") is None


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"image": "evil.example.com/miner:latest"}, "ImageNotAllowed"),
        ({"serviceAccountName": "cluster-admin-ish"}, "ServiceAccountNotAllowed"),
    ],
)
def test_images_and_service_accounts_outside_the_allowlist_are_refused(
    kube: KubeAPI, operator: OperatorThread, spec: dict[str, Any], reason: str
) -> None:
    ns = f"policy-{reason.lower()}"
    apply(kube, server(ns, "qwen-moe", **spec))
    wait_for(lambda: degraded_reason(kube, ns, "qwen-moe") == reason or None, what=reason)
    wait_for(lambda: warnings(kube, ns, "qwen-moe", reason), what="the Warning Event")
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe") is None
    # Allowed ones render.
    allowed = {"image": "example.com/server:2"} if "image" in spec else {"serviceAccountName": "team-a-server"}
    apply(kube, server(ns, "allowed", **allowed))
    pod = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "allowed"), what="the allowed Deployment")["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] in ("moelora-server", "team-a-server")


def test_pods_may_get_exactly_the_secrets_their_adapters_name(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "grants"
    apply(kube, server(ns, "qwen-moe"))
    wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment")
    assert kube.get(ROLES, ns, "qwen-moe-adapter-secrets") is None  # no Secret named: no rule that could match all
    apply(kube, adapter(ns, "a", credentialsSecret={"name": "team-a-s3"}))
    apply(kube, adapter(ns, "b", credentialsSecret={"name": "team-b-s3"}))
    role = wait_for(
        lambda: (
            (r := kube.get(ROLES, ns, "qwen-moe-adapter-secrets")) and len(r["rules"][0]["resourceNames"]) == 2 and r
        ),
        what="the Role",
    )
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["team-a-s3", "team-b-s3"]}
    ]
    binding = kube.get(ROLE_BINDINGS, ns, "qwen-moe-adapter-secrets")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "moelora-server", "namespace": ns}]
    assert binding["roleRef"]["name"] == "qwen-moe-adapter-secrets"
    kube.kubectl("delete", "lora", "a", "b", "-n", ns)
    # One reconcile deletes the Role, then the RoleBinding: between the two the Role alone is gone.
    wait_for(
        lambda: all(kube.get(kind, ns, "qwen-moe-adapter-secrets") is None for kind in (ROLES, ROLE_BINDINGS)) or None,
        what="the Role and the RoleBinding deleted",
    )


@pytest.mark.parametrize(
    ("source", "allowed"),
    [
        ({}, True),  # the server's own endpoint
        ({"endpointUrl": "http://169.254.169.254"}, False),  # request forgery
        ({"endpointUrl": "https://s3.team-b.example.com"}, False),  # listed, but would get the server's credentials
        ({"endpointUrl": "https://s3.team-b.example.com", "credentialsSecret": {"name": "b"}}, True),
    ],
)
def test_adapter_sources_outside_the_allowlist_are_refused(
    kube: KubeAPI, operator: OperatorThread, source: dict[str, Any], allowed: bool
) -> None:
    ns = "sources"
    apply(kube, server(ns, "qwen-moe"))
    name = f"src-{abs(hash(json.dumps(source, sort_keys=True))) % 10**6}"
    apply(kube, adapter(ns, name, **source))
    failed = wait_for(lambda: condition(kube.get(LORA, ns, name), "Failed"), what="the adapter's conditions")
    if allowed:
        assert failed["status"] == "False"
    else:
        assert failed["status"] == "True" and failed["reason"] == "SourceNotAllowed"
        assert kube.get(LORA, ns, name)["status"]["phase"] == "Failed"


def test_a_foreign_role_of_the_grants_name_is_never_bound(kube: KubeAPI, operator: OperatorThread) -> None:
    # Binding the pods' account to a Role someone else wrote would grant whatever its author chose.
    ns = "owner-role"
    foreign = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "qwen-moe-adapter-secrets", "namespace": ns},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    }
    apply(kube, foreign)
    before = kube.get(ROLES, ns, "qwen-moe-adapter-secrets")
    apply(kube, server(ns, "qwen-moe"))
    wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment, before any adapter names a Secret")
    apply(kube, adapter(ns, "a", credentialsSecret={"name": "team-a-s3"}))
    wait_for(lambda: degraded_reason(kube, ns, "qwen-moe") == "NameTaken" or None, what="NameTaken")
    message = condition(kube.get(MS, ns, "qwen-moe"), "Degraded")["message"]
    assert message == "Role qwen-moe-adapter-secrets exists and is not owned by ModelServer qwen-moe"
    assert kube.get(ROLES, ns, "qwen-moe-adapter-secrets") == before
    assert kube.get(ROLE_BINDINGS, ns, "qwen-moe-adapter-secrets") is None
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe") is not None  # what does not depend on the Role still reconciles


def test_a_foreign_budget_holds_back_new_children_but_never_a_running_server(
    kube: KubeAPI, operator: OperatorThread
) -> None:
    ns = "owner-pdb"
    foreign = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "shop", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "shop"}}},
    }
    apply(kube, server(ns, "shop", replicas=1))
    wait_for(lambda: kube.get("v1/services", ns, "shop"), what="the server's children")
    apply(kube, foreign)
    before = kube.get("policy/v1/poddisruptionbudgets", ns, "shop")
    apply(kube, server(ns, "shop", replicas=2))  # two replicas want a budget of that name
    wait_for(lambda: degraded_reason(kube, ns, "shop") == "NameTaken" or None, what="NameTaken")
    # Ours that exist keep reconciling (taking a name cannot freeze a server); the budget is left alone.
    wait_for(lambda: kube.get(DEPLOYMENTS, ns, "shop")["spec"]["replicas"] == 2 or None, what="the scale-up")
    assert kube.get("policy/v1/poddisruptionbudgets", ns, "shop") == before
    ms = kube.get(MS, ns, "shop")
    assert condition(ms, "Ready")["reason"] == "NameTaken" and "endpoint" not in ms["status"]
    # A new server whose budget's name is taken gets nothing at all.
    apply(kube, {**foreign, "metadata": {"name": "fresh", "namespace": ns}})
    apply(kube, server(ns, "fresh", replicas=2))
    wait_for(lambda: degraded_reason(kube, ns, "fresh") == "NameTaken" or None, what="NameTaken")
    time.sleep(1.5)  # a resync later
    assert kube.get(DEPLOYMENTS, ns, "fresh") is None and kube.get("v1/services", ns, "fresh") is None
