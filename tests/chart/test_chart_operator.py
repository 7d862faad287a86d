"""The chart and the real operator together: the operator configured by exactly the environment the chart renders,
run against the emulated API server with the chart's RBAC *enforced* (any request its ServiceAccount may not make
gets 403, as on a real cluster), must do its job and never be refused.

kubectl (the "user") is not subject to it; the operator's clients (kopf and the kubernetes client) are.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import pathlib
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import aiohttp.web
import attrs
import helm_python as helm
import kmock
import pytest
import yaml

from moelora.local import process
from moelora.local.apiserver import Emulator, KubeAPI
from moelora.local.operator_thread import OperatorThread
from moelora.operator.settings import Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "moelora"
EXAMPLES = ROOT / "examples"
NAMESPACE = "moelora-system"
SERVING = "serving"
NAMESPACES = ("default", NAMESPACE, SERVING, "elsewhere")  # what exists in the emulated cluster
MS = "moelora.io/v1alpha1/modelservers"
DEPLOYMENTS = "apps/v1/deployments"

Grants = dict[tuple[str, str, str | None], set[tuple[str, str, str]]]


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = helm.Chart.load(CHART).render(values, name="moelora", namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def grants(objects: list[dict[str, Any]]) -> Grants:
    """{(sa namespace, sa name, where: namespace or None = cluster-wide): {(group, resource, verb)}}."""
    roles = {role["metadata"]["name"]: role for role in objects if role["kind"] == "ClusterRole"}
    result: Grants = {}
    for binding in (obj for obj in objects if obj["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        rules = {
            (group, resource, verb)
            for rule in roles[binding["roleRef"]["name"]]["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }
        for subject in binding["subjects"]:
            key = (subject["namespace"], subject["name"], binding["metadata"].get("namespace"))
            result[key] = result.get(key, set()) | rules
    return result


def operator_settings(objects: list[dict[str, Any]], *, kubeconfig: pathlib.Path) -> tuple[Settings, str]:
    """Settings.from_env over the env the chart gives the operator container; and its ServiceAccount."""
    deployment = next(obj for obj in objects if obj["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    return Settings.from_env({**env, "KUBECONFIG": str(kubeconfig), "MOELORA_RESYNC_SECONDS": "1"}), pod[
        "serviceAccountName"
    ]


_VERBS = {
    kmock.action.LIST: "list",
    kmock.action.WATCH: "watch",
    kmock.action.FETCH: "get",
    kmock.action.CREATE: "create",
    kmock.action.DELETE: "delete",
}


def verb(request: Any) -> str:
    if request.action == kmock.action.UPDATE:
        return "update" if str(request.method).upper().endswith("PUT") else "patch"
    return _VERBS[request.action]


@attrs.define(kw_only=True)
class AuthorizingEmulator(Emulator):
    """The emulator, refusing (403) the requests of non-kubectl clients that `grants` do not allow."""

    account: tuple[str, str] = ("", "")  # (namespace, name) of the ServiceAccount the operator runs as
    grants: Grants = attrs.field(factory=dict)
    allowed: list[str] = attrs.field(factory=list)
    denied: list[str] = attrs.field(factory=list)

    def _decision(self, request: Any) -> tuple[bool, str]:
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        wanted = (request.resource.group or "", resource, verb(request))
        places = [None] + ([request.namespace] if request.namespace else [])
        ok = any(wanted in self.grants.get((*self.account, where), set()) for where in places)
        return ok, f"{wanted[2]} {wanted[0] or 'core'}/{wanted[1]} in {request.namespace or 'all namespaces'}"

    async def __call__(self, raw_request: Any) -> Any:
        # kmock 0.8 cannot parse /api/v1/namespaces (it takes "namespaces" for a namespace prefix and answers 500).
        # kopf lists and watches namespaces when given a list of them: judge that request against the RBAC here,
        # and serve it: a list of NAMESPACES, and a watch that stays quiet until the client goes.
        if raw_request.path == "/api/v1/namespaces":
            action = "watch" if raw_request.query.get("watch") in ("true", "1") else "list"
            ok = ("", "namespaces", action) in self.grants.get((*self.account, None), set())
            (self.allowed if ok else self.denied).append(f"{action} core/namespaces in all namespaces")
            if not ok:
                return aiohttp.web.json_response(
                    status=403,
                    data={
                        "apiVersion": "v1",
                        "kind": "Status",
                        "status": "Failure",
                        "code": 403,
                        "reason": "Forbidden",
                    },
                )
            if action == "list":
                return aiohttp.web.json_response(
                    {
                        "apiVersion": "v1",
                        "kind": "NamespaceList",
                        "metadata": {"resourceVersion": "1"},
                        "items": [
                            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in NAMESPACES
                        ],
                    }
                )
            response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(raw_request)
            await asyncio.sleep(3600)  # cancelled when the client disconnects or the server stops
            return response
        return await super().__call__(raw_request)

    async def _handle(self, request: Any) -> Any:
        agent = request.headers.get("User-Agent", "")
        # Discovery (/api, /apis/<group>/<version>) is open to every authenticated client (system:discovery).
        resource_request = request.resource is not None and request.resource.plural and request.action is not None
        if resource_request and not agent.startswith("kubectl"):
            ok, what = self._decision(request)
            (self.allowed if ok else self.denied).append(what)
            if not ok:
                return await self._render_error(
                    kmock.KubernetesError(status=403, reason="Forbidden", message=f"RBAC: {what} is not allowed")
                )
        return await super()._handle(request)


def peering_resources() -> dict[str, kmock.ResourceInfo]:
    """kopf.dev peering kinds from the chart's crds/ folder, for the emulator (which knows only what it is told)."""
    result = {}
    for entry in helm.Chart.load(CHART).crds:
        for crd in (doc for doc in yaml.safe_load_all(entry["data"]) if doc):
            spec = crd["spec"]
            result[f"{spec['group']}/v1/{spec['names']['plural']}"] = kmock.ResourceInfo(
                namespaced=spec["scope"] == "Namespaced",
                kind=spec["names"]["kind"],
                singular=spec["names"]["singular"],
                verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
            )
    return result


@contextlib.contextmanager
def stack(
    values: dict[str, Any],
    *,
    operators: int = 1,
) -> Iterator[tuple[KubeAPI, AuthorizingEmulator, list[dict[str, Any]], Settings]]:
    """The emulated API server (RBAC of `values` enforced) with the chart's objects in it, and the operator
    (`operators` replicas of it, as the chart's Deployment would run)."""
    objects = render(values)
    api = KubeAPI()
    emulator = AuthorizingEmulator(validate=True)
    for key, info in peering_resources().items():
        emulator.resources[key] = info
    api.emulator = emulator
    with api:
        settings, account = operator_settings(objects, kubeconfig=api.kubeconfig)
        emulator.account, emulator.grants = (NAMESPACE, account), grants(objects)
        # What `helm install` would create that the operator reads: the peering objects.
        for obj in objects:
            if obj["kind"] in ("ClusterKopfPeering", "KopfPeering"):
                api.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
        with contextlib.ExitStack() as replicas:
            for _ in range(operators):
                replicas.enter_context(OperatorThread(settings=own_liveness_port(settings)))
            yield api, emulator, objects, settings


wait_for = functools.partial(process.wait_for, timeout=20)


def own_liveness_port(settings: Settings) -> Settings:
    """The chart's liveness endpoint and metrics port moved to loopback ports of their own: in a cluster each
    replica has its own network namespace, here they share one."""
    parts = urllib.parse.urlsplit(settings.liveness_endpoint or "")
    assert parts.path == "/healthz", settings.liveness_endpoint
    assert settings.metrics_port is not None
    return dataclasses.replace(
        settings,
        liveness_endpoint=f"http://127.0.0.1:{process.free_port()}{parts.path}",
        metrics_port=process.free_port(),
        metrics_host="127.0.0.1",
    )


def example(path: str, *, namespace: str) -> dict[str, Any]:
    obj = yaml.safe_load((EXAMPLES / path).read_text())
    obj["metadata"]["namespace"] = namespace
    return obj


def secret(name: str) -> dict[str, Any]:
    """An adapter's S3 credentials Secret in SERVING."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": SERVING},
        "stringData": {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"},
    }


def server_accounts(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {
        (obj["metadata"]["namespace"], obj["metadata"]["name"])
        for obj in objects
        if obj["kind"] == "ServiceAccount" and obj["metadata"]["namespace"] != NAMESPACE
    }


def check_server(
    api: KubeAPI, objects: list[dict[str, Any]], settings: Settings, name: str, *, timeout: float = 20
) -> dict[str, Any]:
    """The Deployment the operator made for ModelServer `name` in SERVING runs as an account the chart created
    there, with the images the chart pinned."""
    deployment = wait_for(
        lambda: api.get(DEPLOYMENTS, SERVING, name), what=f"the Deployment of {name}", timeout=timeout
    )
    pod = deployment["spec"]["template"]["spec"]
    assert (SERVING, pod["serviceAccountName"]) in server_accounts(objects)
    images = {container["name"]: container["image"] for container in pod["containers"]}
    assert images["vllm"] == settings.server_image == "ghcr.io/moelora/moelora-server:0.1.0-vllm0.26.0"
    assert images["agent"] == settings.agent_image
    return deployment


def test_all_namespaces_standalone() -> None:
    with stack({"server": {"namespaces": [SERVING]}}) as (api, emulator, objects, settings):
        assert settings.namespaces == () and settings.peering is None
        api.kubectl("apply", "-f", "-", stdin=json.dumps(example("modelserver.yaml", namespace=SERVING)))
        check_server(api, objects, settings, "qwen-moe")
        wait_for(
            lambda: ((api.get(MS, SERVING, "qwen-moe") or {}).get("status") or {}).get("endpoint"),
            what="the ModelServer's status",
        )
        assert emulator.allowed and emulator.denied == []


def test_watched_namespaces_with_peering() -> None:
    values = {"watchNamespaces": [SERVING], "operator": {"replicas": 2}}
    with stack(values) as (api, emulator, objects, settings):
        assert settings.namespaces == (SERVING,) and settings.peering == "moelora"
        # kopf keeps its keep-alive in the peering object the chart created: peering is really on.
        wait_for(
            lambda: (api.get("kopf.dev/v1/kopfpeerings", SERVING, "moelora") or {}).get("status"),
            what="a keep-alive in the KopfPeering",
        )
        api.kubectl("apply", "-f", "-", stdin=json.dumps(example("modelserver.yaml", namespace=SERVING)))
        check_server(api, objects, settings, "qwen-moe")
        # Outside the watched namespaces nothing happens (and nothing is asked of the API there).
        api.kubectl("apply", "-f", "-", stdin=json.dumps(example("modelserver.yaml", namespace="elsewhere")))
        time.sleep(2)
        assert api.get(DEPLOYMENTS, "elsewhere", "qwen-moe") is None
        # With namespaces named, the operator turns kopf's namespace scan off: it never lists namespaces.
        assert not any("core/namespaces" in request for request in emulator.allowed)
        assert emulator.denied == []


def test_credentials_secret_without_secret_access() -> None:
    # With operator.secretAccess none the operator's existence check is refused (403) and must be skipped, not
    # retried forever.
    values = {"server": {"namespaces": [SERVING]}, "operator": {"secretAccess": "none"}}
    with stack(values) as (api, emulator, objects, settings):
        server = example("modelserver.yaml", namespace=SERVING)
        server["spec"]["s3"] = {"credentialsSecret": {"name": "s3-credentials"}}
        api.kubectl("apply", "-f", "-", stdin=json.dumps(server))
        check_server(api, objects, settings, "qwen-moe", timeout=6)  # the resync is 1 s: plenty of retries
        assert any("core/secrets" in request for request in emulator.denied)  # the refused path was taken


@pytest.mark.parametrize(
    ("values", "peering"),
    [
        ({"watchNamespaces": [SERVING], "operator": {"replicas": 2}}, ("kopf.dev/v1/kopfpeerings", SERVING)),
        # All namespaces: one ClusterKopfPeering, which the chart's cluster-wide RBAC must let both replicas use.
        ({"server": {"namespaces": [SERVING]}, "operator": {"replicas": 2}}, ("kopf.dev/v1/clusterkopfpeerings", None)),
    ],
    ids=["watched-namespaces", "all-namespaces"],
)
def test_two_replicas_one_works(values: dict[str, Any], peering: tuple[str, str | None]) -> None:
    # kopf pauses every peer when it sees another of the same priority: the replicas must get different ones.
    with stack(values, operators=2) as (api, emulator, objects, settings):
        wait_for(
            lambda: len((api.get(*peering, "moelora") or {}).get("status") or {}) == 2,
            what="keep-alives of both replicas",
        )
        api.kubectl("apply", "-f", "-", stdin=json.dumps(example("modelserver.yaml", namespace=SERVING)))
        check_server(api, objects, settings, "qwen-moe", timeout=8)
        assert emulator.denied == []
