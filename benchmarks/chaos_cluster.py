"""The cluster around the operator in the crash chaos of benchmarks/chaos_operator.py, against the emulated API server.

- `snapshot`: every object of the namespace (Events left out), read in one go in the emulator's loop.
- `World`: a thread playing what a real cluster does besides the operator: the ReplicaSet controller and kubelet
  (ready pods for each Deployment the operator made, and the Deployment's status), the agents (each ready pod reports
  every adapter of its server Loaded, or Failed when the source lies under bad/), and the garbage collector's sweep
  for dependents whose owners are all gone. The emulator collects dependents when an owner is deleted; a real
  collector also removes a dependent created after its owner went (an operator's write racing the deletion).
- `violations`: what is wrong with a snapshot, judged against what the operator should have made of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import threading
from typing import Any

from moelora.local.apiserver import KubeAPI, Rest

NS = "chaos"
MANAGED_BY = ("app.kubernetes.io/managed-by", "moelora")
SERVER_LABEL = "moelora.io/model-server"
CRS = f"/apis/moelora.io/v1alpha1/namespaces/{NS}"
# The kinds a ModelServer may own in this run (no placement, cache, gateway or autoscaling in the specs).
CHILD_KINDS = ("Deployment", "StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Role", "RoleBinding")


@dataclasses.dataclass(frozen=True)
class Item:
    path: str  # the object's URL path on the API server
    raw: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.raw.get("kind"))

    @property
    def meta(self) -> dict[str, Any]:
        return self.raw.get("metadata") or {}

    @property
    def name(self) -> str:
        return str(self.meta.get("name"))

    @property
    def uid(self) -> str:
        return str(self.meta.get("uid"))

    @property
    def spec(self) -> dict[str, Any]:
        return self.raw.get("spec") or {}

    @property
    def status(self) -> dict[str, Any]:
        return self.raw.get("status") or {}

    def owners(self, *, controller: bool = False) -> set[str]:
        refs = self.meta.get("ownerReferences") or []
        return {str(ref.get("uid")) for ref in refs if ref.get("controller") or not controller}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    items: list[Item]

    def of(self, kind: str) -> list[Item]:
        return [item for item in self.items if item.kind == kind]

    def uids(self) -> set[str]:
        return {item.uid for item in self.items}


def snapshot(kube: KubeAPI) -> Snapshot:
    def read() -> list[Item]:
        items = []
        for (resource, namespace, name), obj in kube.emulator.objects.items():
            if obj.deleted or namespace != NS or resource.plural == "events":
                continue
            root = f"/api/{resource.version}" if not resource.group else f"/apis/{resource.group}/{resource.version}"
            path = f"{root}/namespaces/{namespace}/{resource.plural}/{name}"
            items.append(Item(path=path, raw=_copy(obj.raw)))
        return items

    return Snapshot(items=kube.call(read))


def _copy(value: Any) -> Any:
    """A deep copy of plain JSON (much faster than copy.deepcopy, which matters at 10 snapshots a second)."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def bad_source(adapter: Item) -> bool:
    """An adapter whose files every agent refuses (its source lies under bad/)."""
    return "/bad/" in str((adapter.spec.get("source") or {}).get("uri"))


def pod_ready(pod: Item) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.status.get("conditions") or [])


def _stamp() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def agent_entry(adapter: Item) -> dict[str, Any]:
    """What a pod's agent reports for the adapter once it has settled (explicit nulls clear older keys)."""
    uri = str((adapter.spec.get("source") or {}).get("uri"))
    version = hashlib.sha256(uri.encode()).hexdigest()[:16]
    if bad_source(adapter):
        return {"loaded": False, "state": "Failed", "reason": "RankTooHigh", "lastError": "rank 64 > 16",
                "version": None, "loadedAt": None, "observedAt": _stamp()}  # fmt: skip
    return {"loaded": True, "state": "Loaded", "reason": None, "lastError": None, "version": version,
            "loadedAt": _stamp(), "observedAt": _stamp()}  # fmt: skip


class World(threading.Thread):
    """The cluster's other actors, a step every `interval` s until stop(). Counts what it did in `done`."""

    def __init__(self, *, kube: KubeAPI, interval: float = 0.2) -> None:
        super().__init__(name="chaos-world", daemon=True)
        self.kube = kube
        self.rest = Rest(url=kube.url)
        self.interval = interval
        self._halt = threading.Event()
        self.done: dict[str, int] = {"collected": 0, "pods": 0, "reports": 0, "errors": 0}
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        if self.error is not None:
            raise RuntimeError("the chaos world failed") from self.error

    def run(self) -> None:
        try:
            while not self._halt.wait(self.interval):
                self.step(snapshot(self.kube))
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def _write(self, method: str, path: str, body: Any = None) -> None:
        try:
            self.rest.request(method=method, path=path, body=body)
        except RuntimeError:  # a conflict with a write of the operator or the driver: the next step sees it
            self.done["errors"] += 1

    def step(self, snap: Snapshot) -> None:
        alive = snap.uids()
        for item in snap.items:
            owners = item.owners()
            if owners and not owners & alive:
                self._write("DELETE", item.path)
                self.done["collected"] += item.kind != "Pod"
        deployments = [d for d in snap.of("Deployment") if d.owners() & alive]
        for deployment in deployments:
            self._replicate(deployment, snap)
        live = {d.uid for d in deployments}
        pods = [pod for pod in snap.of("Pod") if pod.owners() & live and pod_ready(pod)]
        adapters = [a for a in snap.of("LoRAAdapter") if not a.meta.get("deletionTimestamp")]
        for pod in pods:
            server = (pod.meta.get("labels") or {}).get(SERVER_LABEL)
            for adapter in adapters:
                if adapter.spec.get("modelServer") != server:
                    continue
                current = (adapter.status.get("replicas") or {}).get(pod.name) or {}
                entry = agent_entry(adapter)
                if (current.get("state"), current.get("version")) != (entry["state"], entry["version"]):
                    body = {"status": {"replicas": {pod.name: entry}, "rollup": "Stale"}}
                    self._write("PATCH", f"{adapter.path}/status", body)
                    self.done["reports"] += 1

    def _replicate(self, deployment: Item, snap: Snapshot) -> None:
        """Ready pods for the Deployment's replicas (named by its uid, so a new Deployment gets new pods), the
        excess deleted, and the Deployment's status as its controller writes it once they are ready."""
        replicas = int(deployment.spec.get("replicas", 1))
        wanted = {f"{deployment.name}-{deployment.uid[:5]}-{i}" for i in range(replicas)}
        owned = {pod.name: pod for pod in snap.of("Pod") if deployment.uid in pod.owners()}
        for name in sorted(wanted - set(owned)):
            template = (deployment.spec.get("template") or {}).get("metadata") or {}
            owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment.name,
                     "uid": deployment.uid, "controller": True}  # fmt: skip
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": template.get("labels") or {}, "ownerReferences": [owner]},
                "spec": {"containers": [{"name": "vllm", "image": "x"}]},
            }
            self._write("POST", f"/api/v1/namespaces/{NS}/pods", pod)
            ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            self._write("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status", ready)
            self.done["pods"] += 1
        for name in sorted(set(owned) - wanted):
            self._write("DELETE", owned[name].path)
        ready = sum(pod_ready(pod) for name, pod in owned.items() if name in wanted)
        status = {"observedGeneration": deployment.meta.get("generation"), "replicas": replicas,
                  "readyReplicas": ready, "updatedReplicas": replicas, "availableReplicas": ready}  # fmt: skip
        if any(deployment.status.get(key) != value for key, value in status.items()):
            self._write("PATCH", f"{deployment.path}/status", {"status": status})


def expected_children(server: Item, adapters: list[Item]) -> dict[str, str]:
    """Kind -> name of what the server should own: spec.replicas >= 2 adds the budget, an adapter naming a Secret
    the grant (Role and RoleBinding)."""
    name = server.name
    children = {"Deployment": name, "Service": name}
    if int(server.spec.get("replicas", 1)) >= 2:
        children["PodDisruptionBudget"] = name
    if any(_secret(adapter) for adapter in adapters):
        children["Role"] = children["RoleBinding"] = f"{name}-adapter-secrets"
    return children


def _secret(adapter: Item) -> str | None:
    return ((adapter.spec.get("source") or {}).get("credentialsSecret") or {}).get("name")


def _condition(item: Item, kind: str) -> dict[str, Any]:
    return next((c for c in item.status.get("conditions") or [] if c.get("type") == kind), {})


def violations(snap: Snapshot) -> list[str]:
    """Everything that differs from what the operator should have made of the objects the snapshot holds (empty:
    consistent). Children of gone owners are the garbage collector's, not counted here (World sweeps them)."""
    found: list[str] = []
    alive = snap.uids()
    servers = {s.name: s for s in snap.of("ModelServer") if not s.meta.get("deletionTimestamp")}
    adapters = [a for a in snap.of("LoRAAdapter") if not a.meta.get("deletionTimestamp")]
    for item in snap.items:
        if item.meta.get("deletionTimestamp") and item.meta.get("finalizers"):
            found.append(f"{item.kind} {item.name} deleting, held by finalizers {item.meta['finalizers']}")
        labels = item.meta.get("labels") or {}
        if labels.get(MANAGED_BY[0]) == MANAGED_BY[1] and not item.owners():
            found.append(f"{item.kind} {item.name} carries the managed-by label and has no owner")
    for server in servers.values():
        mine = [a for a in adapters if a.spec.get("modelServer") == server.name]
        found += _server_violations(server, mine, snap)
    pods_of: dict[str, list[Item]] = {}
    live_deployments = {d.uid for d in snap.of("Deployment") if d.owners() & alive}
    for pod in snap.of("Pod"):
        if pod.owners() & live_deployments and pod_ready(pod):
            pods_of.setdefault((pod.meta.get("labels") or {}).get(SERVER_LABEL, ""), []).append(pod)
    for adapter in adapters:
        server_name = adapter.spec.get("modelServer", "")
        found += _adapter_violations(
            adapter, server_name in servers, sorted(p.name for p in pods_of.get(server_name, []))
        )
    return found


def _server_violations(server: Item, adapters: list[Item], snap: Snapshot) -> list[str]:
    found = []
    name, meta = server.name, server.meta
    owned: dict[str, list[Item]] = {}
    for item in snap.items:
        if item.kind in CHILD_KINDS and server.uid in item.owners(controller=True):
            owned.setdefault(item.kind, []).append(item)
    expected = expected_children(server, adapters)
    for kind in CHILD_KINDS:
        names = sorted(item.name for item in owned.get(kind, []))
        wanted = [expected[kind]] if kind in expected else []
        if names != wanted:
            found.append(f"ModelServer {name} owns {kind} {names}, expected {wanted}")
    deployment = next(iter(owned.get("Deployment", [])), None)
    if deployment is not None and deployment.spec.get("replicas") != server.spec.get("replicas", 1):
        found.append(f"Deployment {name} has {deployment.spec.get('replicas')} replicas, the server asks for "
                     f"{server.spec.get('replicas', 1)}")  # fmt: skip
    if deployment is not None:
        args = str(deployment.spec)
        missing = [arg for arg in server.spec.get("engineArgs") or [] if arg not in args]
        if missing:
            found.append(f"Deployment {name} lacks the engine args {missing}")
    secrets = sorted({s for s in map(_secret, adapters) if s})
    for role in owned.get("Role", []):
        granted = (role.raw.get("rules") or [{}])[0].get("resourceNames")
        if granted != secrets:
            found.append(f"Role {role.name} grants {granted}, the adapters name {secrets}")
    status = server.status
    if status.get("observedGeneration") != meta.get("generation"):
        found.append(
            f"ModelServer {name} observedGeneration {status.get('observedGeneration')} != {meta.get('generation')}"
        )
    counts = {
        "desired": len(adapters),
        "loaded": sum(not bad_source(a) for a in adapters),
        "failed": sum(bad_source(a) for a in adapters),
    }
    if status.get("adapters") != counts:
        found.append(f"ModelServer {name} counts {status.get('adapters')}, expected {counts}")
    if status.get("readyReplicas") != server.spec.get("replicas", 1):
        found.append(f"ModelServer {name} readyReplicas {status.get('readyReplicas')}")
    degraded = _condition(server, "Degraded")
    if degraded.get("status") != "False":
        found.append(f"ModelServer {name} Degraded {degraded.get('status')}: {degraded.get('reason')}")
    return found


def _adapter_violations(adapter: Item, server_exists: bool, pods: list[str]) -> list[str]:
    if not server_exists:
        phase, reason = "Failed", "ModelServerNotFound"
    elif bad_source(adapter):
        phase, reason = "Failed", "RankTooHigh"
    else:
        phase, reason = "Loaded", "Loaded"
    status = adapter.status
    wanted = {
        "phase": (status.get("phase"), phase),
        "reason": (_condition(adapter, "Ready").get("reason"), reason),
        "loadedReplicas": (status.get("loadedReplicas"), len(pods) if phase == "Loaded" else 0),
        "desiredReplicas": (status.get("desiredReplicas"), len(pods)),
        "rollup": (status.get("rollup"), "Current"),
        "observedGeneration": (status.get("observedGeneration"), adapter.meta.get("generation")),
        "replicas": (sorted(status.get("replicas") or {}), pods),
    }
    return [
        f"LoRAAdapter {adapter.name}: {key} {actual!r}, expected {value!r}"
        for key, (actual, value) in wanted.items()
        if actual != value
    ]
