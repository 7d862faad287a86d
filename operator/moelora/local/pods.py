"""Rendered pods run as local processes: the kubelet and the Deployment controller the emulator does not have.

kmock stores objects and has no controllers, so nothing would ever turn the operator's Deployment into running
containers. `LocalKubelet` plays both parts for one namespace: it polls the Deployments there, starts `replicas`
pods from each one's pod template, creates the matching Pod objects (so the operator and the agents see the
replicas), and writes the Pods' and the Deployment's status (Ready condition, readyReplicas) as they change.

Each container runs exactly as rendered: its `command` and `args` and `env`, with only these translations from a
pod to one machine:
- `python3` as the first word of the command becomes this interpreter (`sys.executable`), so the local venv runs it;
- downward-API env (`fieldRef`) gets the Pod object's namespace, name, uid, and `127.0.0.1` for IPs;
- `secretKeyRef` env is read from the emulator's Secrets, at container start (optional keys may be absent);
- each volume is a directory under the pod's own temp root: `emptyDir` empty, `configMap` written from the
  emulator's ConfigMap, `persistentVolumeClaim` a local directory from `claims`; every `mountPath` is rewritten to
  that directory wherever it starts a path inside args or env values (`/models/x` -> `<root>/volumes/models/x`);
- ports: two replicas side by side cannot both listen on 8000, so every `containerPort` of the pod gets its own
  free local port, and the same mapping is applied everywhere the pod names that port: an arg that is the port
  (`--port 8000`, `--port=8000`), a `:8000` inside an arg or env value (`http://127.0.0.1:8000`), and the probes
  (named or numbered ports). Containers of one pod share 127.0.0.1 as they share a network namespace in a cluster.
- the agent container is also given `KUBECONFIG` (`extra_env`): it stands in for the in-cluster service account.

Init containers run first, one after another, and must exit 0. Containers that exit are restarted (the
restartPolicy Always of a Deployment), counted in `restartCount`. Probes: the startupProbe must pass before the
readinessProbe is polled; readiness turns true on the first success and false after `failureThreshold`
consecutive failures. Probes are polled every `PROBE_INTERVAL` s rather than `periodSeconds`, so tests are fast;
liveness probes are not acted on (a crash is what restarts a container here).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Self

from moelora.local import process

log = logging.getLogger("moelora.local.pods")

PROBE_INTERVAL = 0.5
RECONCILE_INTERVAL = 0.5
LOCAL_NODE = "moelora-local"


# --- a small REST client for the emulator (plain JSON over HTTP; no credentials on loopback) ----------------------


class Rest:
    """JSON over HTTP to an API server at `url`. Methods return the decoded object, or None on 404."""

    def __init__(self, *, url: str) -> None:
        self.url = url.rstrip("/")

    def request(
        self, *, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {
            "Content-Type": content_type if method == "PATCH" else "application/json",
            "Accept": "application/json",
        }
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:300]!r}") from None
        return json.loads(raw) if raw else None

    def items(self, *, path: str) -> list[dict[str, Any]]:
        """The items of a list, or [] if the resource is unknown."""
        result = self.request(method="GET", path=path)
        return list((result or {}).get("items") or [])


# --- the pure part: a pod template -> what to run ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Probe:
    """An httpGet probe resolved to a local URL."""

    url: str
    failure_threshold: int = 3


@dataclasses.dataclass(frozen=True)
class ContainerPlan:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    startup: Probe | None = None
    readiness: Probe | None = None


@dataclasses.dataclass(frozen=True)
class PodPlan:
    """What running one pod locally means: its processes, where its volumes are, which local ports it uses."""

    name: str
    init_containers: tuple[ContainerPlan, ...]
    containers: tuple[ContainerPlan, ...]
    volumes: Mapping[str, pathlib.Path]  # volume name -> directory
    ports: Mapping[int, int]  # containerPort -> local port


def _field_value(path: str, *, pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    values = {
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.name": meta.get("name", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": LOCAL_NODE,
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path not in values:
        raise ValueError(f"downward API field {path!r} is not emulated")
    return str(values[path])


def _rewriter(*, mounts: Mapping[str, pathlib.Path], ports: Mapping[int, int]) -> Callable[[str], str]:
    """A function applying the mount-path and port translations (see the module docstring) to one string."""
    # Longest mount path first, so /var/lib/x/y wins over /var/lib/x.
    path_rules = [
        (re.compile(r"(?<![\w.\-/])" + re.escape(mount.rstrip("/")) + r"(?=/|$|[\s,:;])"), str(local))
        for mount, local in sorted(mounts.items(), key=lambda item: -len(item[0]))
    ]
    port_rules = [
        (re.compile(r"(?<=:)" + str(container) + r"(?!\d)"), str(local)) for container, local in ports.items()
    ]

    def rewrite(value: str) -> str:
        for container, local in ports.items():
            if value == str(container):
                return str(local)
            flag, sep, tail = value.partition("=")
            if sep and flag.startswith("-") and tail == str(container):
                return f"{flag}={local}"
        for pattern, local in path_rules:
            value = pattern.sub(lambda _m, local=local: local, value)
        for pattern, local in port_rules:
            value = pattern.sub(local, value)
        return value

    return rewrite


def plan_pod(
    *,
    pod: Mapping[str, Any],
    root: pathlib.Path,
    ports: Mapping[int, int],
    secret: Callable[[str, str], str | None],
    claims: Mapping[str, pathlib.Path] = {},
    base_env: Mapping[str, str] = {},
    extra_env: Mapping[str, Mapping[str, str]] = {},
) -> PodPlan:
    """Translate a Pod object (metadata + the Deployment template's spec) into local processes. Pure but for
    `secret(name, key)` (None when the key or Secret is absent).

    `ports` maps every containerPort of the pod to a local port; `claims` maps PVC names to directories;
    `base_env` is the environment every container starts from (what an image would set, e.g. PATH, HOME);
    `extra_env` adds variables per container name. Raises ValueError for what cannot run locally.
    """
    spec = pod.get("spec") or {}
    volumes: dict[str, pathlib.Path] = {}
    for volume in spec.get("volumes") or []:
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in claims:
                raise ValueError(f"volume {volume['name']}: no local directory for PersistentVolumeClaim {claim!r}")
            volumes[volume["name"]] = claims[claim]
        else:
            volumes[volume["name"]] = root / "volumes" / volume["name"]
    all_containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    port_names = {
        p["name"]: int(p["containerPort"]) for c in all_containers for p in c.get("ports") or [] if "name" in p
    }

    def container_plan(container: Mapping[str, Any]) -> ContainerPlan:
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            local = volumes[mount["name"]]
            if mount.get("subPath"):
                local = local / mount["subPath"]
            mounts[mount["mountPath"]] = local
        rewrite = _rewriter(mounts=mounts, ports=ports)
        command = list(container.get("command") or [])
        if not command:
            raise ValueError(f"container {container['name']}: no command (image entrypoints are not emulated)")
        if command[0] in ("python3", "python"):
            command[0] = sys.executable
        argv = tuple(rewrite(word) for word in [*command, *(container.get("args") or [])])
        env = dict(base_env)
        for var in container.get("env") or []:
            name, source = var["name"], var.get("valueFrom")
            if source is None:
                env[name] = rewrite(str(var.get("value", "")))
            elif "fieldRef" in source:
                env[name] = _field_value(source["fieldRef"]["fieldPath"], pod=pod)
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = secret(ref["name"], ref["key"])
                if value is None:
                    if ref.get("optional"):
                        continue
                    raise ValueError(
                        f"container {container['name']}: env {name}: Secret {ref['name']!r} has no key {ref['key']!r}"
                    )
                env[name] = value
            else:
                raise ValueError(f"container {container['name']}: env {name}: {sorted(source)} is not emulated")
        env.update(extra_env.get(container["name"], {}))

        def probe(kind: str) -> Probe | None:
            spec_probe = container.get(kind)
            if not spec_probe:
                return None
            http = spec_probe.get("httpGet")
            if http is None:
                raise ValueError(f"container {container['name']}: {kind}: only httpGet probes are emulated")
            port = http["port"]
            container_port = port_names[port] if isinstance(port, str) and not port.isdigit() else int(port)
            return Probe(
                url=f"http://127.0.0.1:{ports[container_port]}{http.get('path', '/')}",
                failure_threshold=int(spec_probe.get("failureThreshold", 3)),
            )

        return ContainerPlan(
            name=container["name"], argv=argv, env=env, startup=probe("startupProbe"), readiness=probe("readinessProbe")
        )

    return PodPlan(
        name=(pod.get("metadata") or {})["name"],
        init_containers=tuple(container_plan(c) for c in spec.get("initContainers") or []),
        containers=tuple(container_plan(c) for c in spec.get("containers") or []),
        volumes=volumes,
        ports=dict(ports),
    )


def container_ports(template_spec: Mapping[str, Any]) -> list[int]:
    """Every containerPort a pod declares (init containers included), each once."""
    found = []
    for container in [*(template_spec.get("initContainers") or []), *(template_spec.get("containers") or [])]:
        for port in container.get("ports") or []:
            if int(port["containerPort"]) not in found:
                found.append(int(port["containerPort"]))
    return found


def template_hash(template: Mapping[str, Any]) -> str:
    """A short hash of a pod template, like the pod-template-hash label of a ReplicaSet."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


# --- the impure part: running one pod -----------------------------------------------------------------------------


@dataclasses.dataclass
class ContainerState:
    plan: ContainerPlan
    process: subprocess.Popen[bytes] | None = None
    started: bool = False  # startupProbe passed (or there is none)
    ready: bool = False
    failures: int = 0
    restarts: int = 0
    log_path: pathlib.Path = pathlib.Path()


class LocalPod:
    """One pod's containers as processes, with a supervisor thread (init containers, restarts, probes).

    `ready` is the pod's Ready condition; `error` is set if it could not start (e.g. an init container failed).
    """

    def __init__(self, *, plan: PodPlan, root: pathlib.Path, on_change: Callable[[], None] = lambda: None) -> None:
        self.plan = plan
        self.root = root
        self.on_change = on_change
        self.containers = {
            c.name: ContainerState(plan=c, log_path=root / "logs" / f"{c.name}.log") for c in plan.containers
        }
        self.error: str | None = None
        self.waiting_reason: str | None = None  # set with `error` when the pod never started
        self.ready = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._supervise, name=f"pod-{plan.name}", daemon=True)

    @property
    def name(self) -> str:
        return self.plan.name

    def url(self, container_port: int) -> str:
        """http://127.0.0.1:<local port> for a containerPort of this pod."""
        return f"http://127.0.0.1:{self.plan.ports[container_port]}"

    def log(self, container: str) -> str:
        path = self.root / "logs" / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        for path in self.plan.volumes.values():
            path.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        with self._lock:
            for state in self.containers.values():
                if state.process is not None:
                    process.stop(state.process)

    def kill(self, container: str) -> None:
        """Kill one container's process group (SIGKILL), as an OOM kill would; the supervisor restarts it."""
        with self._lock:
            proc = self.containers[container].process
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    def _spawn(self, state: ContainerState) -> None:
        state.process = process.spawn(argv=state.plan.argv, env=state.plan.env, log_path=state.log_path, cwd=self.root)
        state.started = state.plan.startup is None
        state.ready = False
        state.failures = 0

    def _supervise(self) -> None:
        for init in self.plan.init_containers:
            log_path = self.root / "logs" / f"{init.name}.log"
            proc = process.spawn(argv=init.argv, env=init.env, log_path=log_path, cwd=self.root)
            while proc.poll() is None:
                if self._stop.wait(0.2):
                    process.stop(proc)
                    return
            if proc.returncode != 0:
                self.error = f"init container {init.name} exited with {proc.returncode}; see {log_path}"
                self.waiting_reason = "Init:Error"
                log.error("pod %s: %s", self.name, self.error)
                self.on_change()
                return
        with self._lock:
            for state in self.containers.values():
                self._spawn(state)
        while not self._stop.wait(PROBE_INTERVAL):
            changed = False
            with self._lock:
                for state in self.containers.values():
                    assert state.process is not None
                    if state.process.poll() is not None:  # restartPolicy: Always
                        log.warning(
                            "pod %s: container %s exited with %s; restarting",
                            self.name,
                            state.plan.name,
                            state.process.returncode,
                        )
                        self._spawn(state)
                        state.restarts += 1  # after _spawn: a visible restart count implies the reset state
                        changed = True
            for state in self.containers.values():
                changed |= self._probe(state)
            ready = all(state.ready for state in self.containers.values())
            if ready != self.ready:
                self.ready = ready
                changed = True
            if changed:
                self.on_change()

    @staticmethod
    def _probe(state: ContainerState) -> bool:
        """Poll the container's startup and readiness probes; True if its readiness changed."""
        if not state.started:
            assert state.plan.startup is not None
            if not process.http_ok(state.plan.startup.url):
                return False
            state.started = True
        before = state.ready
        probe = state.plan.readiness
        if probe is None:
            state.ready = True
        elif process.http_ok(probe.url):
            state.ready, state.failures = True, 0
        else:
            state.failures += 1
            if not state.ready or state.failures >= probe.failure_threshold:
                state.ready = False
        return state.ready != before


# --- the controller: Deployments in the emulator -> LocalPods + Pod objects + status -------------------------------


def _python_path() -> dict[str, str]:
    """This process's PYTHONPATH, made absolute (containers start in their pod's directory): run from a source
    checkout, the pods then run that checkout's code, as an image would hold it."""
    value = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in value.split(os.pathsep) if p)} if value else {}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LocalKubelet:
    """Runs the pods of every Deployment in `namespace` locally and keeps their objects and status current.

    `base_env`: the environment of every container (defaults to PATH, HOME, LANG, TMPDIR and PYTHONPATH of this
    process);
    `extra_env`: more variables per container name (the local stack passes KUBECONFIG to the agent);
    `claims`: PersistentVolumeClaim name -> local directory. Use as a context manager or `start()`/`stop()`.
    """

    def __init__(
        self,
        *,
        api_url: str,
        namespace: str,
        root: pathlib.Path,
        base_env: Mapping[str, str] | None = None,
        extra_env: Mapping[str, Mapping[str, str]] = {},
        claims: Mapping[str, pathlib.Path] = {},
    ) -> None:
        self.rest = Rest(url=api_url)
        self.namespace = namespace
        self.root = root
        self.base_env = (
            dict(base_env)
            if base_env is not None
            else {key: os.environ[key] for key in ("PATH", "HOME", "LANG", "TMPDIR") if key in os.environ}
            | _python_path()
        )
        self.extra_env = extra_env
        self.claims = claims
        self.pods: dict[str, dict[str, LocalPod]] = {}  # deployment name -> pod name -> pod
        self._hashes: dict[str, str] = {}  # deployment name -> template hash of its pods
        self._written: dict[str, Any] = {}  # what we last wrote, to write only changes
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)
        self.errors: collections.deque[str] = collections.deque(maxlen=100)  # the latest reconcile errors

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        with self._lock:
            for deployment in list(self.pods):
                self._scale_to(deployment, [])

    def pods_of(self, deployment: str) -> list[LocalPod]:
        with self._lock:
            return list(self.pods.get(deployment, {}).values())

    def wait_ready(self, deployment: str, *, replicas: int, timeout: float) -> list[LocalPod]:
        """Block until `replicas` pods of `deployment` are ready; return them. TimeoutError (with logs) if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = self.pods_of(deployment)
            if len(pods) == replicas and all(pod.ready for pod in pods):
                return pods
            failed = [pod for pod in pods if pod.error]
            if failed:
                raise RuntimeError(f"pod {failed[0].name}: {failed[0].error}")
            time.sleep(0.2)
        tails = "\n".join(
            f"--- {pod.name} {name}:\n{pod.log(name)[-3000:]}"
            for pod in self.pods_of(deployment)
            for name in pod.containers
        )
        raise TimeoutError(f"{deployment}: {replicas} ready pods not reached in {timeout:.0f} s\n{tails}")

    # -- the loop ---------------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception as exc:
                log.exception("local kubelet: reconcile failed")
                self.errors.append(str(exc))
            self._wake.wait(RECONCILE_INTERVAL)
            self._wake.clear()

    def _reconcile(self) -> None:
        deployments = {
            d["metadata"]["name"]: d
            for d in self.rest.items(path=f"/apis/apps/v1/namespaces/{self.namespace}/deployments")
        }
        with self._lock:
            for name in list(self.pods):
                if name not in deployments:
                    self._scale_to(name, [])
                    del self.pods[name]
            for name, deployment in deployments.items():
                self._reconcile_deployment(name, deployment)

    def _reconcile_deployment(self, name: str, deployment: dict[str, Any]) -> None:
        spec = deployment.get("spec") or {}
        template = spec.get("template") or {}
        digest = template_hash(template)
        pods = self.pods.setdefault(name, {})
        if self._hashes.get(name) != digest:  # a new template: replace every pod (a Recreate rollout)
            self._scale_to(name, [])
            self._hashes[name] = digest
        want = int(spec.get("replicas", 1))
        while len(pods) > want:
            self._delete_pod(name, max(pods))
        while len(pods) < want:
            self._create_pod(name, deployment, digest)
        for pod in pods.values():
            self._write_pod_status(pod)
        ready = sum(1 for pod in pods.values() if pod.ready)
        status = {
            "observedGeneration": (deployment.get("metadata") or {}).get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": len(pods) - ready,
        }
        if self._written.get(f"deployment/{name}") != status:
            self.rest.request(
                method="PATCH",
                path=f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}/status",
                body={"status": status},
            )
            self._written[f"deployment/{name}"] = status

    def _scale_to(self, deployment: str, keep: list[str]) -> None:
        for pod_name in [p for p in self.pods.get(deployment, {}) if p not in keep]:
            self._delete_pod(deployment, pod_name)

    def _create_pod(self, deployment_name: str, deployment: dict[str, Any], digest: str) -> None:
        template = deployment["spec"]["template"]
        pod_name = f"{deployment_name}-{digest[:8]}-{secrets.token_hex(3)[:5]}"
        meta = template.get("metadata") or {}
        owner = deployment["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.namespace,
                "labels": {**(meta.get("labels") or {}), "pod-template-hash": digest},
                "annotations": dict(meta.get("annotations") or {}),
                # Deployment -> ReplicaSet -> Pod in a cluster; the emulated GC deletes these with the Deployment.
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": owner["name"],
                        "uid": owner.get("uid", ""),
                        "controller": True,
                    }
                ],
            },
            "spec": {**template.get("spec", {}), "nodeName": LOCAL_NODE},
        }
        created = self.rest.request(method="POST", path=f"/api/v1/namespaces/{self.namespace}/pods", body=body)
        root = self.root / pod_name
        ports = {port: process.free_port() for port in container_ports(template.get("spec") or {})}
        try:
            plan = plan_pod(
                pod=created or body,
                root=root,
                ports=ports,
                secret=self._secret,
                claims=self.claims,
                base_env=self.base_env,
                extra_env=self.extra_env,
            )
        except ValueError as exc:
            log.error("pod %s cannot run locally: %s", pod_name, exc)
            self.errors.append(f"{pod_name}: {exc}")
            plan = PodPlan(name=pod_name, init_containers=(), containers=(), volumes={}, ports=ports)
            pod = LocalPod(plan=plan, root=root, on_change=self._wake.set)
            pod.error = str(exc)
            pod.waiting_reason = "CreateContainerConfigError"  # a kubelet retries; here the pod stays Pending
        else:
            pod = LocalPod(plan=plan, root=root, on_change=self._wake.set)
            pod.start()
        self.pods[deployment_name][pod_name] = pod
        log.info("pod %s started (ports %s, files in %s)", pod_name, ports, root)

    def _delete_pod(self, deployment: str, pod_name: str) -> None:
        pod = self.pods[deployment].pop(pod_name)
        pod.stop()
        self.rest.request(method="DELETE", path=f"/api/v1/namespaces/{self.namespace}/pods/{pod_name}")
        self._written.pop(f"pod/{pod_name}", None)
        shutil.rmtree(pod.root / "volumes", ignore_errors=True)  # emptyDirs go with the pod; logs stay

    def _write_pod_status(self, pod: LocalPod) -> None:
        containers = [
            {
                "name": name,
                "ready": state.ready,
                "restartCount": state.restarts,
                "started": state.started,
                "image": "local",
                "state": {"running": {}}
                if state.process is not None and state.process.poll() is None
                else {"waiting": {"reason": pod.waiting_reason or "ContainerCreating"}},
            }
            for name, state in pod.containers.items()
        ]
        ready = "True" if pod.ready else "False"
        key = f"pod/{pod.name}"
        summary = (ready, pod.error, [(c["ready"], c["restartCount"], c["started"]) for c in containers])
        if self._written.get(key) == summary:
            return
        status = {
            "phase": "Pending" if pod.error or not any(c.process for c in pod.containers.values()) else "Running",
            "podIP": "127.0.0.1",
            "hostIP": "127.0.0.1",
            "conditions": [
                {"type": kind, "status": ready, "lastTransitionTime": _now()} for kind in ("Ready", "ContainersReady")
            ],
            "containerStatuses": containers,
        }
        if pod.error:
            status["message"] = pod.error
        self.rest.request(
            method="PATCH", path=f"/api/v1/namespaces/{self.namespace}/pods/{pod.name}/status", body={"status": status}
        )
        self._written[key] = summary

    def _secret(self, name: str, key: str) -> str | None:
        secret = self.rest.request(method="GET", path=f"/api/v1/namespaces/{self.namespace}/secrets/{name}")
        if secret is None:
            return None
        if key in (secret.get("stringData") or {}):  # kmock stores what was posted; a real server folds it into data
            return str(secret["stringData"][key])
        encoded = (secret.get("data") or {}).get(key)
        return None if encoded is None else base64.b64decode(encoded).decode()
