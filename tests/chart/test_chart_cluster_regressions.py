"""What held when the chart and the operator were tried against a real kube-apiserver (v1.36, RBAC and PodSecurity
admission, the real controller-manager), kept as regression tests against the emulated API server with the chart's
RBAC enforced (any request its ServiceAccounts may not make gets 403):

- deleting a ModelServer leaves nothing it owns: every child carries a controller ownerReference to it, which is
  what the garbage collector follows (the emulator collects by ownerReferences the same way), and nothing else goes;
- each server's agents list and watch only their server's LoRAAdapters, by `spec.modelServer` field selector (the
  CRD's selectableFields), as the chart's server ServiceAccount.

Covered elsewhere (not repeated here): no 403 cluster-wide, with watchNamespaces and with two replicas
(test_chart_operator.py, test_chart_rbac_used.py); children and status (tests/operator/test_operator_integration.py).
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes.config
import kubernetes.watch

from moelora.agent.report.kube import Kube
from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread

from .test_chart_operator import MS, SERVING, example, own_liveness_port, secret, stack, wait_for

VALUES = {"server": {"namespaces": [SERVING]}}  # the defaults (all namespaces), server pods in SERVING
# Every kind the operator makes for a server, by the API path the emulator's client takes.
CHILD_KINDS = {
    "Deployment": "apps/v1/deployments",
    "StatefulSet": "apps/v1/statefulsets",
    "Service": "v1/services",
    "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "Role": "rbac.authorization.k8s.io/v1/roles",
    "RoleBinding": "rbac.authorization.k8s.io/v1/rolebindings",
    "ConfigMap": "v1/configmaps",
    "PersistentVolumeClaim": "v1/persistentvolumeclaims",
    "Job": "batch/v1/jobs",
}
LORA = "moelora.io/v1alpha1/loraadapters"


def apply(api: KubeAPI, obj: dict[str, Any]) -> None:
    api.kubectl("apply", "-f", "-", stdin=json.dumps(obj))


def server(name: str, **spec: Any) -> dict[str, Any]:
    obj = example("modelserver.yaml", namespace=SERVING)
    obj["metadata"]["name"] = name
    obj["spec"].update(spec)
    return obj


def adapter(name: str, server_name: str, **source: Any) -> dict[str, Any]:
    obj = example("loraadapter.yaml", namespace=SERVING)
    obj["metadata"]["name"] = name
    obj["spec"]["modelServer"] = server_name
    obj["spec"]["source"].update(source)
    return obj


def owned(api: KubeAPI, uid: str) -> set[tuple[str, str]]:
    """(kind, name) of every object in SERVING whose ownerReferences name `uid`."""
    return {
        (kind, obj["metadata"]["name"])
        for kind, path in CHILD_KINDS.items()
        for obj in api.list(path, SERVING)
        if uid in {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}
    }


def everything(api: KubeAPI) -> dict[tuple[str, str], str]:
    """(kind, name) -> uid of every object of CHILD_KINDS, the servers and the adapters in SERVING."""
    kinds = {**CHILD_KINDS, "ModelServer": MS, "LoRAAdapter": LORA}
    return {
        (kind, obj["metadata"]["name"]): obj["metadata"]["uid"]
        for kind, path in kinds.items()
        for obj in api.list(path, SERVING)
    }


def test_deleting_a_server_collects_everything_it_owns_and_nothing_else() -> None:
    with stack(VALUES, operators=0) as (api, emulator, _, settings):
        with OperatorThread(settings=own_liveness_port(settings)):
            for name in ("server-s3", "team-a-s3"):
                apply(api, secret(name))
            credentials = {"s3": {"credentialsSecret": {"name": "server-s3"}}}
            # Placed on a StatefulSet (its headless Service), two replicas (the budget), an adapter with its own Secret
            # (the Role and RoleBinding granting it to the pods).
            apply(api, server("gone", replicas=2, placement={"copies": 1}, **credentials))
            apply(api, adapter("gone-adapter", "gone", credentialsSecret={"name": "team-a-s3"}))
            # A model cache: its claim and the Job that fills it.
            cached = server("cached")
            cached["spec"]["model"]["cache"] = {"size": "10Gi"}
            apply(api, cached)
            # One that stays, with its own Deployment, Service and budget.
            apply(api, server("kept", replicas=2))
            apply(api, adapter("kept-adapter", "kept"))

            expected = {
                "gone": {
                    ("StatefulSet", "gone"),
                    ("Service", "gone"),
                    ("Service", "gone-pods"),
                    ("PodDisruptionBudget", "gone"),
                    ("Role", "gone-adapter-secrets"),
                    ("RoleBinding", "gone-adapter-secrets"),
                },
                "cached": {"PersistentVolumeClaim", "Job"},
                "kept": {("Deployment", "kept"), ("Service", "kept"), ("PodDisruptionBudget", "kept")},
            }
            uids = {
                name: wait_for(lambda n=name: api.get(MS, SERVING, n), what=name)["metadata"]["uid"]
                for name in expected
            }
            wait_for(lambda: expected["gone"] <= owned(api, uids["gone"]) or None, what="the placed server's children")
            wait_for(
                lambda: {kind for kind, _ in owned(api, uids["cached"])} >= expected["cached"] or None,
                what="the model cache's claim and Job",
            )
            wait_for(lambda: owned(api, uids["kept"]) == expected["kept"] or None, what="the kept server's children")
            assert owned(api, uids["gone"]) == expected["gone"]
            # What the garbage collector follows: one controller reference, to the server by kind, name and uid.
            for name, uid in uids.items():
                for kind, child in owned(api, uid):
                    refs = api.get(CHILD_KINDS[kind], SERVING, child)["metadata"]["ownerReferences"]
                    assert [
                        (ref["apiVersion"], ref["kind"], ref["name"], ref["uid"], ref.get("controller")) for ref in refs
                    ] == [("moelora.io/v1alpha1", "ModelServer", name, uid, True)], (kind, child)

        # Deleted with the operator stopped, so what is collected is exactly the deleted servers' children (a reconcile
        # in flight could make one again after the delete, which the garbage collector would take soon after).
        children = {name: owned(api, uid) for name, uid in uids.items()}
        before = everything(api)
        api.kubectl("delete", "ms", "gone", "cached", "-n", SERVING, "--wait=true", "--timeout=20s")
        wait_for(lambda: not owned(api, uids["gone"]) and not owned(api, uids["cached"]) or None, what="collected")
        after = everything(api)
        gone = {key for key in before if key not in after}
        assert gone == children["gone"] | children["cached"] | {("ModelServer", "gone"), ("ModelServer", "cached")}
        # Nothing else went or was replaced: the other server's children, both adapters (the users'), the Secrets.
        assert {key: uid for key, uid in before.items() if key not in gone} == after
        assert ("LoRAAdapter", "gone-adapter") in after
        assert api.get("v1/secrets", SERVING, "team-a-s3") is not None
        assert emulator.denied == []


def test_agents_list_and_watch_only_their_servers_adapters() -> None:
    with stack(VALUES, operators=0) as (api, emulator, objects, settings):
        # Judged as the server pods' ServiceAccount: the chart's namespaced grants to the agent.
        emulator.account = (SERVING, settings.server_service_account)
        for name, server_name in (("a1", "mine"), ("b1", "theirs"), ("a2", "mine")):
            apply(api, adapter(name, server_name))
        agent = Kube(
            client=kubernetes.config.new_client_from_config(config_file=str(api.kubeconfig)), namespace=SERVING
        )
        items, version = agent.list_adapters(model_server="mine")
        assert sorted(item["metadata"]["name"] for item in items) == ["a1", "a2"]
        assert agent.field_selectors  # the API server took the selector: no fall-back to whole-namespace lists
        for name, server_name in (("b2", "theirs"), ("a3", "mine")):
            apply(api, adapter(name, server_name))
        events = agent.watch_adapters(
            resource_version=version, timeout_seconds=2, watch=kubernetes.watch.Watch(), model_server="mine"
        )
        assert [(kind, obj["metadata"]["name"]) for kind, obj in events] == [("ADDED", "a3")]
        # The same selection through kubectl, as a user would ask.
        listed = api.kubectl("get", "lora", "-n", SERVING, "--field-selector", "spec.modelServer=theirs", "-o", "name")
        assert sorted(listed.stdout.split()) == ["loraadapter.moelora.io/b1", "loraadapter.moelora.io/b2"]
        assert emulator.allowed and emulator.denied == []
