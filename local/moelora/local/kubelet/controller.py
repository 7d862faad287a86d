"""The controller the emulator lacks: the Deployments and StatefulSets of a namespace -> running `LocalPod`s, Pod
objects, status.

kmock stores objects and has no controllers, so nothing would ever turn the operator's Deployment into running
containers. `LocalKubelet` plays both the workload controllers and the kubelet for one namespace: it polls the
Deployments and StatefulSets there, starts `replicas` pods from each one's pod template (`plan`, then `pod`), creates
the matching Pod objects (so the operator and the agents see the replicas), and writes the Pods' and the workload's
status (Ready condition, readyReplicas) as they change. A changed template replaces every pod (a Recreate rollout).
A StatefulSet's pods are named by ordinal (`<name>-0`, `<name>-1`, ...), created and removed all at once as
`podManagementPolicy: Parallel` does, the highest ordinals leaving first on a scale-down.
"""

from __future__ import annotations

import base64
import collections
import logging
import os
import pathlib
import secrets
import shutil
import threading
import time
from collections.abc import Mapping
from typing import Any, Self

from moelora.local import process
from moelora.local.apiserver.client import Rest
from moelora.local.apiserver.objects import now
from moelora.local.kubelet.batch import LocalBatch
from moelora.local.kubelet.plan import LOCAL_NODE, PodPlan, container_ports, plan_pod, template_hash
from moelora.local.kubelet.pod import GRACE, LocalPod, stop_pods

log = logging.getLogger("moelora.local.kubelet")

RECONCILE_INTERVAL = 0.5
WORKLOADS = {"Deployment": "deployments", "StatefulSet": "statefulsets"}  # kind -> plural, both run here


def node_vllm_cache() -> str:
    """VLLM_CACHE_ROOT for every local container unless its pod sets one (spec.kernels.compileCache): one writable
    cache that this machine's pods share, as a warm image layer would be. vLLM keeps its model-class inspection there;
    with each pod's own emptyDir HOME, every vLLM start would inspect the model class again in a child interpreter."""
    return str(process.cache_dir() / "local-node" / "vllm")


def _python_path() -> dict[str, str]:
    """This process's PYTHONPATH, made absolute (containers start in their pod's directory): run from a source
    checkout, the pods then run that checkout's code, as an image would hold it."""
    value = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in value.split(os.pathsep) if p)} if value else {}


class LocalKubelet:
    """Runs the pods of every Deployment in `namespace` locally and keeps their objects and status current.

    `base_env`: the environment of every container (defaults to PATH, HOME, LANG, TMPDIR and PYTHONPATH of this
    process, and `node_vllm_cache()` as VLLM_CACHE_ROOT);
    `extra_env`: more variables per container name (the local stack passes KUBECONFIG to the agent);
    `claims`: PersistentVolumeClaim name -> local directory (other claims get one under `root/claims`, and Jobs run
    once under `root/jobs`: batch.py). Use as a context manager or `start()`/`stop()`.
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
            | {"VLLM_CACHE_ROOT": node_vllm_cache()}
        )
        self.extra_env = extra_env
        # PersistentVolumeClaims (those in `claims` bound to their given directory) and Jobs: see batch.py.
        self.batch = LocalBatch(
            rest=self.rest,
            namespace=namespace,
            root=root,
            secret=self._secret,
            base_env=self.base_env,
            claims=dict(claims),
            on_change=lambda: self._wake.set(),
        )
        self.claims = self.batch.claims
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

    def stop(self, *, grace: float = GRACE) -> None:
        """Stop every pod (and Job run) together, each container getting SIGTERM and SIGKILL after `grace` s, and
        delete their Pod objects."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        with self._lock:
            running = [pod for pods in self.pods.values() for pod in pods.values()]
            stop_pods([*running, *self.batch.runs.values()], grace=grace)
            for deployment in list(self.pods):
                self._scale_to(deployment, [])  # stopped already: this deletes their objects and volumes

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
        self.batch.reconcile()
        deployments = {
            d["metadata"]["name"]: {**d, "kind": kind}
            for kind, plural in WORKLOADS.items()
            for d in self.rest.items(path=f"/apis/apps/v1/namespaces/{self.namespace}/{plural}")
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
        if deployment.get("kind") == "StatefulSet":
            ordinals = [f"{name}-{ordinal}" for ordinal in range(want)]
            self._delete_pods(name, [p for p in pods if p not in ordinals])
            for pod_name in [p for p in ordinals if p not in pods]:
                self._create_pod(name, deployment, digest, pod_name=pod_name)
        self._delete_pods(name, sorted(pods)[want:])
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
                path=f"/apis/apps/v1/namespaces/{self.namespace}/{WORKLOADS[deployment['kind']]}/{name}/status",
                body={"status": status},
            )
            self._written[f"deployment/{name}"] = status

    def _scale_to(self, deployment: str, keep: list[str]) -> None:
        self._delete_pods(deployment, [p for p in self.pods.get(deployment, {}) if p not in keep])

    def _create_pod(
        self, deployment_name: str, deployment: dict[str, Any], digest: str, *, pod_name: str | None = None
    ) -> None:
        template = deployment["spec"]["template"]
        pod_name = pod_name or f"{deployment_name}-{digest[:8]}-{secrets.token_hex(3)[:5]}"
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
                        "kind": deployment.get("kind", "Deployment"),
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

    def _delete_pods(self, deployment: str, names: list[str]) -> None:
        """Stop the pods together, then delete their objects. A kubelet sends a deleted pod's containers SIGTERM and
        SIGKILLs them once its terminationGracePeriodSeconds has passed; one workload's pods share theirs."""
        pods = [self.pods[deployment].pop(name) for name in names]
        if pods:
            stop_pods(pods, grace=max(pod.plan.grace for pod in pods))
        for pod in pods:
            self.rest.request(method="DELETE", path=f"/api/v1/namespaces/{self.namespace}/pods/{pod.name}")
            self._written.pop(f"pod/{pod.name}", None)
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
                {"type": kind, "status": ready, "lastTransitionTime": now()} for kind in ("Ready", "ContainersReady")
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
        encoded = (secret.get("data") or {}).get(key)
        return None if encoded is None else base64.b64decode(encoded).decode()
