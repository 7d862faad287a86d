"""RBAC as used = RBAC as granted: every API request the operator and the adapter agent make while doing their jobs
against the emulated API server is recorded (verb, group, resource/subresource, namespace) and compared with the
chart's rendered RBAC for the operator's and the server's ServiceAccounts, both ways: nothing used that is not
granted, nothing granted that is not used, but for the few grants only a real cluster exercises (NOT_EXERCISED).

RBAC is enforced while recording (as in test_chart_operator.py), including the Roles the operator creates at run
time, with their resourceNames: the agent may read exactly the Secrets its server's adapters name.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import inspect
import json
from collections.abc import Iterator
from typing import Any

import attrs
import kmock
import kubernetes.client
import kubernetes.config
import kubernetes.watch
import pytest

from moelora.agent.report.kube import Kube
from moelora.api import AdapterPhase, ReplicaAdapterState
from moelora.local.apiserver import Emulator, KubeAPI
from moelora.local.operator_thread import OperatorThread

from .test_chart_operator import (
    DEPLOYMENTS,
    MS,
    NAMESPACE,
    SERVING,
    AuthorizingEmulator,
    Grants,
    example,
    grants,
    operator_settings,
    own_liveness_port,
    peering_resources,
    render,
    secret,
    verb,
    wait_for,
)

VALUES = {"server": {"namespaces": [SERVING]}}  # all namespaces watched, one server namespace, standalone
VALUE_SETS = {
    "all-namespaces": VALUES,
    # Watched namespaces: RBAC by RoleBindings, kopf's namespaced peering (two replicas turn it on).
    "watched-with-peering": {"watchNamespaces": [SERVING], "operator": {"replicas": 2}},
    # All namespaces with cluster-wide peering.
    "all-namespaces-with-peering": {**VALUES, "operator": {"replicas": 2}},
}
AGENT_USER_AGENT = "moelora-agent-under-test"
PDBS = "policy/v1/poddisruptionbudgets"
ROLES = "rbac.authorization.k8s.io/v1/roles"
LORA = "moelora.io/v1alpha1/loraadapters"
JOBS = "batch/v1/jobs"
CLAIMS = "v1/persistentvolumeclaims"
STATEFULSETS = "apps/v1/statefulsets"

# Granted, and needed, but not exercised against the emulator; each with its reason.
NOT_EXERCISED: dict[tuple[str, str, str], str] = {
    # Owner references with blockOwnerDeletion need it only where admission enforces it (OpenShift's
    # OwnerReferencesPermissionEnforcement); nothing sends this verb.
    ("moelora.io", "modelservers/finalizers", "update"): "checked by admission on a real cluster",
    # The kernel-config ConfigMap a server renders with kernels.configs=auto, deleted when it stops asking for it
    # (tests/operator/test_operator_kernel_configs.py exercises it with a stand-in kernel bundle).
    **{("", "configmaps", verb): "needs a bundled kernel config set" for verb in ("create", "patch", "delete")},
    # Issue 19's children, written only when a server asks for them, and their CRDs are not installed in the
    # emulator (tests/operator/test_gateway.py, test_autoscaling.py and test_multinode.py check what is rendered);
    # each reconcile of a server without them still reads them (get), to delete ours once turned off.
    **{
        (group, resource, verb): f"{resource} are rendered only when asked for; their CRDs are not installed here"
        for group, resource in (
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
            ("inference.networking.k8s.io", "inferencepools"),
            ("gateway.networking.k8s.io", "httproutes"),
            ("autoscaling", "horizontalpodautoscalers"),
            ("keda.sh", "scaledobjects"),
        )
        for verb in ("create", "patch", "delete")
    },
    # Listed only for a gateway-routed server's adapters (tests/operator/test_operator_routing.py lists them).
    ("", "configmaps", "list"): "only with routing.gateway, whose CRDs are not installed here",
    # A single-node server's Deployment is deleted when it moves to a LeaderWorkerSet (spec.nodes > 1).
    ("apps", "deployments", "delete"): "only when a server moves to several nodes, whose CRD is not installed here",
}


@dataclasses.dataclass(frozen=True)
class Use:
    account: tuple[str, str]  # (namespace, name) of the ServiceAccount
    group: str
    resource: str  # plural, or plural/subresource
    verb: str
    namespace: str | None  # None: a cluster-wide request


@attrs.define(kw_only=True)
class RecordingEmulator(AuthorizingEmulator):
    """Records each request of the operator and the agent, and refuses (403) what their RBAC does not allow: the
    chart's `grants`, plus the Roles and RoleBindings stored in the emulator (those the operator makes)."""

    operator: tuple[str, str] = ("", "")
    agent: tuple[str, str] = ("", "")
    used: list[Use] = attrs.field(factory=list)

    async def __call__(self, raw_request: Any) -> Any:
        # The namespace list kopf follows in a namespaced watch is served (and judged) by AuthorizingEmulator.
        if raw_request.path == "/api/v1/namespaces":
            action = "watch" if raw_request.query.get("watch") in ("true", "1") else "list"
            self.used.append(Use(self.operator, "", "namespaces", action, None))
        return await super().__call__(raw_request)

    def _runtime_grant(self, account: tuple[str, str], use: Use, name: str | None) -> bool:
        """Whether a stored RoleBinding for `account` grants `use` on object `name` (resourceNames honoured)."""
        stored = {
            (key[0].plural, key[1], key[2]): obj.raw
            for key, obj in self.objects.items()
            if not obj.deleted and key[0].group == "rbac.authorization.k8s.io"
        }
        for (plural, namespace, _), binding in stored.items():
            if plural != "rolebindings" or namespace != use.namespace:
                continue
            subjects = {(s.get("namespace"), s["name"]) for s in binding.get("subjects") or []}
            role = stored.get(("roles", namespace, binding["roleRef"]["name"]))
            if account not in subjects or role is None:
                continue
            for rule in role.get("rules") or []:
                if (
                    use.group in rule["apiGroups"]
                    and use.resource in rule["resources"]
                    and use.verb in rule["verbs"]
                    and (not rule.get("resourceNames") or name in rule["resourceNames"])
                ):
                    return True
        return False

    async def _handle(self, request: Any) -> Any:
        agent = request.headers.get("User-Agent", "")
        resource_request = request.resource is not None and request.resource.plural and request.action is not None
        if resource_request and not agent.startswith("kubectl"):
            account = self.agent if agent.startswith(AGENT_USER_AGENT) else self.operator
            resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
            use = Use(account, request.resource.group or "", resource, verb(request), request.namespace)
            self.used.append(use)
            if not granted(self.grants, use) and not self._runtime_grant(account, use, request.name):
                self.denied.append(f"{use} {request.name}")
                return await self._render_error(
                    kmock.KubernetesError(status=403, reason="Forbidden", message=f"RBAC: {use} is not allowed")
                )
            if not self._holds_what_it_grants(account, request):
                self.denied.append(f"escalation: {use} {request.name}")
                return await self._render_error(
                    kmock.KubernetesError(
                        status=403, reason="Forbidden", message="attempting to grant RBAC permissions"
                    )
                )
        return await Emulator._handle(self, request)  # judged above, not by AuthorizingEmulator's single account

    def _holds_what_it_grants(self, account: tuple[str, str], request: Any) -> bool:
        """RBAC's escalation check (the account has no `escalate`/`bind`): a Role written, or a RoleBinding to a
        stored Role, may grant only what the writer holds itself."""
        body = request.data if isinstance(request.data, dict) else {}
        if request.resource.plural == "roles":
            rules = body.get("rules")
        elif request.resource.plural == "rolebindings" and body.get("roleRef"):
            key = (kmock.resource("rbac.authorization.k8s.io/v1/roles"), request.namespace, body["roleRef"]["name"])
            rules = self.objects[key].raw.get("rules") if key in self.objects else None
        else:
            return True
        return all(
            granted(self.grants, Use(account, group, resource, verb_, request.namespace))
            for rule in rules or []
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb_ in rule["verbs"]
        )


def granted(grants: Grants, use: Use) -> bool:
    wanted = (use.group, use.resource, use.verb)
    places = [None] + ([use.namespace] if use.namespace else [])
    return any(wanted in grants.get((*use.account, where), set()) for where in places)


def unused(grants: Grants, used: list[Use], accounts: set[tuple[str, str]]) -> set[tuple[Any, ...]]:
    """Chart grants of `accounts` that no recorded request used (in the place they are granted), but for
    NOT_EXERCISED."""
    result = set()
    for (sa_namespace, sa_name, where), rules in grants.items():
        if (sa_namespace, sa_name) not in accounts:
            continue
        for rule in rules - set(NOT_EXERCISED):
            if not any(
                (use.group, use.resource, use.verb) == rule
                and use.account == (sa_namespace, sa_name)
                and (where is None or use.namespace == where)
                for use in used
            ):
                result.add((sa_name, where, *rule))
    return result


def agent_kube(api: KubeAPI) -> Kube:
    """The agent's own client code, under the server ServiceAccount (told apart by its User-Agent)."""
    client = kubernetes.config.new_client_from_config(config_file=str(api.kubeconfig))
    client.user_agent = AGENT_USER_AGENT
    return Kube(client=client, namespace=SERVING)


@dataclasses.dataclass
class Recording:
    objects: list[dict[str, Any]]
    emulator: RecordingEmulator
    agent_reads: dict[str, dict[str, str] | None]


@contextlib.contextmanager
def recorded(values: dict[str, Any]) -> Iterator[tuple[KubeAPI, RecordingEmulator, list[dict[str, Any]]]]:
    """The emulated API server with the RBAC of `values` enforced and recorded, and the operator running."""
    objects = render(values)
    api = KubeAPI()
    emulator = RecordingEmulator(validate=True)
    for key, info in peering_resources().items():
        emulator.resources[key] = info
    api.emulator = emulator
    with api:
        settings, account = operator_settings(objects, kubeconfig=api.kubeconfig)
        emulator.operator, emulator.agent = (NAMESPACE, account), (SERVING, settings.server_service_account)
        emulator.account, emulator.grants = emulator.operator, grants(objects)
        for obj in objects:  # what `helm install` creates that the operator reads: the peering object
            if obj["kind"] in ("ClusterKopfPeering", "KopfPeering"):
                api.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
        with OperatorThread(settings=own_liveness_port(settings)):
            yield api, emulator, objects


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def recording(request: pytest.FixtureRequest) -> Iterator[Recording]:
    """One run of everything the two identities do: a server with S3 credentials and two replicas (its budget),
    an adapter with a credentials Secret (its Role), the agent's watch, Secret read and status patch, a scale back
    to one replica and the adapter's deletion (deletes), a model cache made and dropped, a name taken by someone
    else (the Warning Event)."""
    with recorded(VALUE_SETS[request.param]) as (api, emulator, objects):
        kubectl = applier(api)
        for name in ("server-s3", "team-a-s3", "team-b-s3"):
            kubectl(secret(name))
        server = example("modelserver.yaml", namespace=SERVING)
        server["spec"].update(replicas=2, s3={"credentialsSecret": {"name": "server-s3"}})
        kubectl(server)
        wait_for(lambda: api.get(PDBS, SERVING, "qwen-moe"), what="the budget")
        adapter = example("loraadapter.yaml", namespace=SERVING)
        adapter["spec"]["source"]["credentialsSecret"] = {"name": "team-a-s3"}
        kubectl(adapter)
        wait_for(lambda: api.get(ROLES, SERVING, "qwen-moe-adapter-secrets"), what="the adapters' Role")
        # A pod of the server comes: its adapters are judged again (each read first).
        kubectl(server_pod())
        # Hand edits of what the operator owns are put back (patches) by the next resync; all four edited at once,
        # so one resync (a second apart) puts them back rather than one each.
        for kind, (_, name) in OWNED.items():
            api.kubectl("annotate", "--overwrite", kind, name, "-n", SERVING, f"{HASH}=edited")
        wait_for(lambda: all(edit_reverted(api, *owned) for owned in OWNED.values()), what="the four put back")

        agent = agent_kube(api)
        items, version = agent.list_adapters()
        assert [item["metadata"]["name"] for item in items] == ["support-bot"]
        # The watch runs out its second (the least a server honours) while the rest goes on: nothing waits on it.
        watch = concurrent.futures.ThreadPoolExecutor(1)
        watched = watch.submit(
            lambda: list(
                agent.watch_adapters(resource_version=version, timeout_seconds=1, watch=kubernetes.watch.Watch())
            )
        )
        reads = {name: agent.read_secret(name=name) for name in ("team-a-s3", "team-b-s3")}
        # A pod the operator's index does not know (yet): the operator reads it before pruning its entry.
        assert agent.patch_replica(
            name="support-bot", pod="qwen-moe-unknown", state=ReplicaAdapterState(loaded=True), info=None
        )
        wait_for(
            lambda: any(use.resource == "pods" and use.verb == "get" for use in emulator.used), what="the pod read"
        )
        agent.create_pod_event(pod="qwen-moe-unknown", pod_uid="", reason="ForeignAdapterUnloaded", message="intruder")
        assert agent.patch_on_demand_load(name="support-bot", pod="qwen-moe-abc", load=0.5)  # the status subresource
        # The same failure twice on the known pod: its Warning Event is created, then patched (counted).
        denied = ReplicaAdapterState(state=AdapterPhase.FAILED, reason="AccessDenied", last_error="403")
        for state in (denied, ReplicaAdapterState(state=AdapterPhase.DOWNLOADING), denied):
            agent.patch_replica(name="support-bot", pod="qwen-moe-abc", state=state, info=None)
            wait_for(functools.partial(phase_is, api, state.state.value), what=state.state.value)
        wait_for(lambda: any(use.resource == "events" and use.verb == "patch" for use in emulator.used), what="patch")

        watched.result(timeout=60)  # its failure is the recording's
        watch.shutdown()
        api.kubectl("scale", "ms/qwen-moe", "-n", SERVING, "--replicas=1")
        wait_for(lambda: api.get(PDBS, SERVING, "qwen-moe") is None or None, what="the budget deleted")
        api.kubectl("delete", "lora", "support-bot", "-n", SERVING)
        wait_for(lambda: api.get(ROLES, SERVING, "qwen-moe-adapter-secrets") is None or None, what="Role gone")
        # A shared model cache (its claim and fill Job), then dropped from the spec (both deleted).
        cached = example("modelserver.yaml", namespace=SERVING)
        cached["metadata"]["name"] = "cached"
        cached["spec"]["model"]["cache"] = {"size": "10Gi"}
        kubectl(cached)
        wait_for(lambda: api.list(JOBS, SERVING) and api.list(CLAIMS, SERVING), what="the model cache")
        del cached["spec"]["model"]["cache"]
        kubectl(cached)
        wait_for(lambda: not api.list(JOBS, SERVING) and not api.list(CLAIMS, SERVING) or None, what="cache gone")
        kubectl({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken", "namespace": SERVING}})
        taken = example("modelserver.yaml", namespace=SERVING)
        taken["metadata"]["name"] = "taken"
        kubectl(taken)
        # The operator's Event, not the agent's from above.
        wait_for(
            lambda: any(use.resource == "events" and use.account == emulator.operator for use in emulator.used),
            what="the NameTaken Warning Event",
        )
        # Nothing of it is created while its Service's name is someone else's; freed, it all is.
        assert api.get(DEPLOYMENTS, SERVING, "taken") is None
        api.kubectl("delete", "service", "taken", "-n", SERVING)
        api.kubectl("annotate", "ms", "taken", "-n", SERVING, "example.com/freed=yes")  # reconciled now, not at resync
        wait_for(lambda: api.get(DEPLOYMENTS, SERVING, "taken"), what="the other server's Deployment")
        # spec.placement on and off again: the StatefulSet and its headless Service replace the Deployment, and back.
        placement = json.dumps({"spec": {"placement": {"copies": 1}}})
        api.kubectl("patch", "ms", "taken", "-n", SERVING, "--type=merge", "-p", placement)
        wait_for(lambda: api.get(STATEFULSETS, SERVING, "taken"), what="the StatefulSet")
        wait_for(lambda: api.get(DEPLOYMENTS, SERVING, "taken") is None or None, what="the Deployment deleted")
        api.kubectl("scale", "ms/taken", "-n", SERVING, "--replicas=2")
        wait_for(lambda: (api.get(STATEFULSETS, SERVING, "taken") or {})["spec"]["replicas"] == 2 or None, what="2")
        api.kubectl("patch", "ms", "taken", "-n", SERVING, "--type=merge", "-p", '{"spec": {"placement": null}}')
        wait_for(lambda: api.get(STATEFULSETS, SERVING, "taken") is None or None, what="the StatefulSet deleted")
        wait_for(lambda: api.get("v1/services", SERVING, "taken-pods") is None or None, what="headless gone")
    yield Recording(objects=objects, emulator=emulator, agent_reads=reads)


HASH = "moelora.io/desired-hash"


# kubectl's kind -> (resource, name) of what the operator owns for the server qwen-moe.
OWNED = {
    "service": ("v1/services", "qwen-moe"),
    "poddisruptionbudget": (PDBS, "qwen-moe"),
    "role": (ROLES, "qwen-moe-adapter-secrets"),
    "rolebinding": ("rbac.authorization.k8s.io/v1/rolebindings", "qwen-moe-adapter-secrets"),
}


def edit_reverted(api: KubeAPI, resource: str, name: str) -> bool:
    got = api.get(resource, SERVING, name)
    return got is not None and got["metadata"]["annotations"][HASH] != "edited"


def phase_is(api: KubeAPI, phase: str) -> bool:
    return ((api.get(LORA, SERVING, "support-bot") or {}).get("status") or {}).get("phase") == phase


def server_pod() -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "moelora", "moelora.io/model-server": "qwen-moe"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "qwen-moe-abc", "namespace": SERVING, "labels": labels},
        "spec": {"containers": [{"name": "vllm", "image": "x"}]},
    }


def applier(api: KubeAPI) -> Any:
    def apply(obj: dict[str, Any]) -> None:
        api.kubectl("apply", "-f", "-", stdin=json.dumps(obj))

    return apply


def accounts(recording: Recording) -> set[tuple[str, str]]:
    return {recording.emulator.operator, recording.emulator.agent}


def test_the_agent_reads_only_the_secrets_its_adapters_name(recording: Recording) -> None:
    assert recording.agent_reads["team-a-s3"] == {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}
    assert recording.agent_reads["team-b-s3"] is None  # refused: no adapter names it
    assert [denial for denial in recording.emulator.denied if "team-b-s3" not in denial] == []


# The agent's every API call, each exercised by the recording: a new one must be added there too.
AGENT_CALLS = {
    "list_adapters",
    "watch_adapters",
    "read_secret",
    "patch_replica",
    "patch_on_demand_load",
    "create_pod_event",
}


def test_nothing_used_is_not_granted_and_nothing_granted_is_unused(recording: Recording) -> None:
    # Its methods; `core` (the lazily built CoreV1Api) is no call of its own.
    assert {name for name, value in vars(Kube).items() if inspect.isfunction(value) and name[0] != "_"} == AGENT_CALLS
    emulator = recording.emulator
    ungranted = {
        use
        for use in emulator.used
        if not granted(emulator.grants, use) and not (use.account == emulator.agent and use.resource == "secrets")
    }
    assert ungranted == set()
    assert unused(emulator.grants, emulator.used, accounts(recording)) == set()


def test_a_deliberately_removed_rule_is_caught(recording: Recording) -> None:
    objects = json.loads(json.dumps(recording.objects))
    operator_role = next(
        obj for obj in objects if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == "moelora-operator"
    )
    operator_role["rules"] = [
        rule for rule in operator_role["rules"] if "poddisruptionbudgets" not in rule["resources"]
    ]
    fewer = grants(objects)
    missing = {(use.resource, use.verb) for use in recording.emulator.used if not granted(fewer, use)}
    assert {("poddisruptionbudgets", "create"), ("poddisruptionbudgets", "delete")} <= missing


def test_a_deliberately_added_rule_is_caught(recording: Recording) -> None:
    more = {key: set(rules) for key, rules in recording.emulator.grants.items()}
    more[(*recording.emulator.agent, SERVING)].add(("", "configmaps", "watch"))
    assert unused(more, recording.emulator.used, accounts(recording)) == {
        (recording.emulator.agent[1], SERVING, "", "configmaps", "watch")
    }


def test_without_secret_access_the_grant_is_refused_and_reported() -> None:
    # operator.secretAccess none: the operator holds no `get` on Secrets, so RBAC refuses the Role it would create.
    values = {**VALUES, "operator": {"secretAccess": "none"}}
    with recorded(values) as (api, emulator, _):
        applier(api)(example("modelserver.yaml", namespace=SERVING))
        adapter = example("loraadapter.yaml", namespace=SERVING)
        adapter["spec"]["source"]["credentialsSecret"] = {"name": "team-a-s3"}
        applier(api)(adapter)

        def reason() -> str | None:
            for cond in ((api.get(MS, SERVING, "qwen-moe") or {}).get("status") or {}).get("conditions") or []:
                if cond["type"] == "Degraded" and cond["status"] == "True":
                    return str(cond["reason"])
            return None

        wait_for(lambda: reason() == "SecretGrantForbidden" or None, what="SecretGrantForbidden")
        assert api.get(DEPLOYMENTS, SERVING, "qwen-moe") is not None  # serving goes on without the grant
        assert api.get(ROLES, SERVING, "qwen-moe-adapter-secrets") is None
        assert any(denial.startswith("escalation:") for denial in emulator.denied)
