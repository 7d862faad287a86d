"""The two controllers a model cache needs that the emulator lacks: a volume provisioner and a Job controller.

`LocalBatch` binds each PersistentVolumeClaim of the namespace to a directory under its root (as a provisioner of
the storage classes it knows would; a claim naming another class stays Pending, like one with no provisioner), and
runs each Job's pod once as local processes (its containers one after another, as `LocalPod` runs init
containers), then writes the Job's status as the Job controller would: `succeeded` and a Complete condition, or
`failed` and a Failed one. No retries (backoffLimit is not emulated) and no Pod objects for Job pods.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from moelora.local.apiserver.client import Rest
from moelora.local.apiserver.objects import now
from moelora.local.kubelet.plan import plan_pod
from moelora.local.kubelet.pod import LocalPod

log = logging.getLogger("moelora.local.kubelet")

DEFAULT_STORAGE_CLASSES = frozenset({"standard"})


@dataclasses.dataclass
class LocalBatch:
    """Claims -> directories under `root/claims`, Jobs -> one local run each under `root/jobs`."""

    rest: Rest
    namespace: str
    root: pathlib.Path
    secret: Callable[[str, str], str | None]
    base_env: Mapping[str, str]
    storage_classes: frozenset[str] = DEFAULT_STORAGE_CLASSES  # a claim naming none gets the default class
    claims: dict[str, pathlib.Path] = dataclasses.field(default_factory=dict)  # claim name -> directory
    runs: dict[str, LocalPod] = dataclasses.field(default_factory=dict)  # Job name -> its pod
    on_change: Callable[[], None] = lambda: None

    def reconcile(self) -> None:
        self._bind_claims()
        self._run_jobs()

    def _bind_claims(self) -> None:
        for claim in self.rest.items(path=f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims"):
            name = claim["metadata"]["name"]
            directory = self.claims.get(name, self.root / "claims" / name)  # a directory given up front, or ours
            if (claim.get("status") or {}).get("phase") == "Bound":
                self.claims[name] = directory
                continue
            wanted = (claim.get("spec") or {}).get("storageClassName")
            if wanted is not None and wanted not in self.storage_classes:
                continue  # no provisioner for that class: Pending, as in a cluster
            directory.mkdir(parents=True, exist_ok=True)
            self.claims[name] = directory
            storage = ((claim.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage", "0")
            modes = (claim.get("spec") or {}).get("accessModes") or []
            status = {"phase": "Bound", "capacity": {"storage": storage}, "accessModes": modes}
            self._patch("persistentvolumeclaims", name, status)
            log.info("claim %s bound to %s", name, directory)

    def _run_jobs(self) -> None:
        jobs = {
            j["metadata"]["name"]: j for j in self.rest.items(path=f"/apis/batch/v1/namespaces/{self.namespace}/jobs")
        }
        for name in [n for n in self.runs if n not in jobs]:  # deleted: stop its run
            self.runs.pop(name).stop()
        for name, job in jobs.items():
            if _finished(job):
                continue
            run = self.runs.get(name)
            if run is None:
                self._start(name, job)
            elif run.error is not None:
                self._finish(name, succeeded=False, message=run.error)
            elif run.ready:
                self._finish(name, succeeded=True, message="")

    def _start(self, name: str, job: Mapping[str, Any]) -> None:
        template = job["spec"]["template"]
        spec = dict(template.get("spec") or {})
        # Each container once, in order, each to exit 0: what LocalPod does with init containers.
        spec = {**spec, "initContainers": [*(spec.get("initContainers") or []), *spec.get("containers", [])]}
        spec["containers"] = []
        pod = {"metadata": {"name": f"{name}-run", "namespace": self.namespace, "uid": ""}, "spec": spec}
        root = self.root / "jobs" / name
        try:
            plan = plan_pod(
                pod=pod, root=root, ports={}, secret=self.secret, claims=self.claims, base_env=self.base_env
            )
        except ValueError as exc:
            log.info("job %s waits: %s", name, exc)  # e.g. its claim is not bound yet
            return
        run = LocalPod(plan=plan, root=root, on_change=self.on_change)
        run.start()
        self.runs[name] = run
        self._patch("jobs", name, {"active": 1, "startTime": now()})
        log.info("job %s started (files in %s)", name, root)

    def _finish(self, name: str, *, succeeded: bool, message: str) -> None:
        kind, count = ("Complete", "succeeded") if succeeded else ("Failed", "failed")
        condition = {"type": kind, "status": "True", "lastTransitionTime": now(), "message": message}
        if not succeeded:
            condition["reason"] = "BackoffLimitExceeded"
        self._patch("jobs", name, {"active": 0, count: 1, "completionTime": now(), "conditions": [condition]})
        log.info("job %s %s", name, kind.lower())

    def _patch(self, plural: str, name: str, status: dict[str, Any]) -> None:
        group = "/api/v1" if plural == "persistentvolumeclaims" else "/apis/batch/v1"
        self.rest.request(
            method="PATCH", path=f"{group}/namespaces/{self.namespace}/{plural}/{name}/status", body={"status": status}
        )


def _finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )
