"""The shared model cache (spec.model.cache): a PersistentVolumeClaim, a Job that fills it once, and the cache's
state judged from both. Pure functions of the spec, the settings and the stored claim and Job.

The claim and the Job carry a digest of what their content depends on (source, size, class, access modes) in
their names, so a changed source or size is a new claim filled by a new Job, while the Deployment keeps serving
from the old claim until the new one is Ready (children.py renders the Deployment only then). The old ones are
then deleted (pvc-protection keeps a claim until the last pod mounting it is gone).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from moelora.api import ModelCachePhase, ModelCacheStatus, ModelServerSpec
from moelora.operator.errors import SpecProblem
from moelora.operator.render import engine, naming, security
from moelora.operator.render.deployment import s3_env
from moelora.operator.settings import Settings

LABEL_COMPONENT = "app.kubernetes.io/component"
COMPONENT = "model-cache"
ANNOTATION_SOURCE = "moelora.io/model-source"
FETCH_CONTAINER = "fetch-model"
# A failed download is retried by the Job a few times (S3 or the hub can fail transiently) before it is Failed.
FETCH_BACKOFF_LIMIT = 3
_HOME = "/tmp"  # the fill container's HOME: the hub keeps its lock files there, under a read-only root
# The hub's download into a plain directory (not its symlinked cache), with the server image's huggingface_hub.
_HF_DOWNLOAD = (
    "import sys; from huggingface_hub import snapshot_download; "
    "snapshot_download(repo_id=sys.argv[1], local_dir=sys.argv[2])"
)


def digest(spec: ModelServerSpec, *, server: str) -> str:
    """What the cache's content and claim depend on, hashed; the server's name too, so truncated names stay apart."""
    cache = spec.model.cache
    assert cache is not None
    key = {
        "server": server,
        "source": _source(spec),
        "size": cache.size,
        "storageClassName": cache.storage_class_name,
        "accessModes": list(cache.access_modes),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]


def _name(server: str, kind: str, key: str) -> str:
    # A Job's name becomes a pod label value (at most 63 characters); the digest keeps shortened names unique.
    return f"{server[:36]}-{kind}-{key}"


def claim_name(spec: ModelServerSpec, *, server: str) -> str:
    return _name(server, "model-cache", digest(spec, server=server))


def job_name(spec: ModelServerSpec, *, server: str) -> str:
    return _name(server, "model-fetch", digest(spec, server=server))


def labels(server: str) -> dict[str, str]:
    """The claim's and Job's labels: the server's, plus the component that tells the stale caches to prune."""
    return {**naming.labels(server), LABEL_COMPONENT: COMPONENT}


def _source(spec: ModelServerSpec) -> str:
    return spec.model.source or f"hf://{spec.model.name}"


def claim(spec: ModelServerSpec, *, server: str, namespace: str) -> dict[str, Any]:
    """The PersistentVolumeClaim that holds the weights."""
    cache = spec.model.cache
    assert cache is not None
    claim_spec: dict[str, Any] = {
        "accessModes": list(cache.access_modes),
        "resources": {"requests": {"storage": cache.size}},
        "volumeMode": "Filesystem",
    }
    if cache.storage_class_name:
        claim_spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(spec, server=server),
            "namespace": namespace,
            "labels": labels(server),
            "annotations": {ANNOTATION_SOURCE: _source(spec)},
        },
        "spec": claim_spec,
    }


def _fetch_container(spec: ModelServerSpec, *, settings: Settings) -> dict[str, Any]:
    model = engine.model_ref(spec)
    env: list[dict[str, Any]] = [{"name": "HOME", "value": _HOME}]
    if model.scheme == "s3":
        image, command, source = settings.agent_image, ["python3", "-m", "moelora.agent", "fetch-model"], model.uri
        env += s3_env(spec)
    elif model.scheme == "hf":
        image, command, source = spec.image or settings.server_image, ["python3", "-c", _HF_DOWNLOAD], model.uri
        env += [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}, *engine.token_env(spec)]
    else:
        raise SpecProblem("InvalidSpec", "model.cache is for hf:// and s3:// sources")  # the schema forbids it
    return {
        "name": FETCH_CONTAINER,
        "image": image,
        "command": command,
        "args": [source or "", engine.MODELS_DIR],
        "env": env,
        "volumeMounts": [
            {"name": "models", "mountPath": engine.MODELS_DIR},
            {"name": security.TMP_VOLUME, "mountPath": security.TMP_DIR},
        ],
        "securityContext": dict(security.CONTAINER_DEFAULTS),
    }


def fetch_job(spec: ModelServerSpec, *, server: str, namespace: str, settings: Settings) -> dict[str, Any]:
    """The Job that downloads the weights into the claim, once."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": spec.service_account_name or settings.server_service_account,
        "automountServiceAccountToken": False,  # the download needs S3 or the hub, never the Kubernetes API
        "securityContext": security.pod_security_context(spec),
        "containers": [_fetch_container(spec, settings=settings)],
        "volumes": [
            {"name": "models", "persistentVolumeClaim": {"claimName": claim_name(spec, server=server)}},
            {"name": security.TMP_VOLUME, "emptyDir": {}},
        ],
    }
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": ref.name} for ref in spec.image_pull_secrets]
    if spec.node_selector:  # a ReadWriteOnce claim is then bound in the serving node pool
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [dict(toleration) for toleration in spec.tolerations]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(spec, server=server),
            "namespace": namespace,
            "labels": labels(server),
            "annotations": {ANNOTATION_SOURCE: _source(spec)},
        },
        "spec": {
            "backoffLimit": FETCH_BACKOFF_LIMIT,
            "template": {
                # Not the server's selector labels: the Service and the Deployment must never count this pod.
                "metadata": {"labels": {naming.LABEL_NAME: "moelora-model-fetch", naming.LABEL_INSTANCE: server}},
                "spec": pod,
            },
        },
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheState:
    """The cache as observed: its status, and the problem to report when a person must act."""

    status: ModelCacheStatus
    problem: SpecProblem | None = None
    # The Job is older than the claim: it filled a claim since deleted, so it must go and run again.
    stale_job: bool = False

    @property
    def ready(self) -> bool:
        return self.status.phase == ModelCachePhase.READY


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def _age(obj: Mapping[str, Any], now: datetime.datetime) -> float:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return 0.0
    when = datetime.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    return (now - when).total_seconds()


def state(
    spec: ModelServerSpec,
    *,
    server: str,
    claim: Mapping[str, Any] | None,
    job: Mapping[str, Any] | None,
    now: datetime.datetime,
    unbound_after: float,
) -> CacheState:
    """Pending -> Filling -> Ready | Failed, from the stored claim and Job (None: not created yet). A claim still
    unbound after `unbound_after` seconds will not bind by itself (no such class, no capacity): reported."""
    name = claim_name(spec, server=server)

    def result(
        phase: ModelCachePhase, message: str, problem: tuple[str, str] | None = None, *, stale_job: bool = False
    ) -> CacheState:
        capacity = ((claim or {}).get("status") or {}).get("capacity", {}).get("storage")
        status = ModelCacheStatus(phase=phase, claim_name=name, capacity=capacity, message=message)
        return CacheState(status=status, problem=SpecProblem(*problem) if problem else None, stale_job=stale_job)

    if claim is not None and job is not None and _age(job, now) > _age(claim, now):
        return result(
            ModelCachePhase.PENDING, f"PersistentVolumeClaim {name} was made again: filling it again", stale_job=True
        )

    if claim is not None and (claim.get("status") or {}).get("phase") == "Lost":
        message = f"PersistentVolumeClaim {name} lost its volume; delete the claim to fill a new one"
        return result(ModelCachePhase.FAILED, message, ("ModelCacheLost", message))
    if job is not None and (failed := _condition(job, "Failed")) is not None:
        why = str(failed.get("message") or failed.get("reason") or "the Job failed")
        message = f"Job {job_name(spec, server=server)} failed: {why}; delete the Job to fetch again"
        return result(ModelCachePhase.FAILED, message, ("ModelCacheFailed", message))
    if claim is not None and job is not None and _condition(job, "Complete") is not None:
        return result(ModelCachePhase.READY, f"filled by Job {job_name(spec, server=server)}")
    if claim is None or job is None:
        return result(ModelCachePhase.PENDING, "creating the claim and its fill Job")
    if (claim.get("status") or {}).get("phase") != "Bound":
        if _age(claim, now) >= unbound_after:
            message = (
                f"PersistentVolumeClaim {name} is not bound after {unbound_after:g} s: check its events and "
                "spec.model.cache.storageClassName"
            )
            return result(ModelCachePhase.PENDING, message, ("ModelCacheUnbound", message))
        return result(ModelCachePhase.PENDING, f"waiting for PersistentVolumeClaim {name} to be bound")
    return result(ModelCachePhase.FILLING, f"Job {job_name(spec, server=server)} is downloading the weights")
