"""The shared model cache through the real kopf operator against the emulated API server. The emulator has no
PersistentVolume or Job controller: the test binds the claim and finishes the Job itself, as those would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.api import ModelServerSpec
from moelora.local import process
from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread
from moelora.operator.render import model_cache

from .cluster import DEPLOYMENTS, MS, apply, condition, manifest, patch_status, wait_for
from .conftest import running_operator

CLAIMS = "v1/persistentvolumeclaims"
JOBS = "batch/v1/jobs"
UNBOUND_AFTER = 2.0
S3_MODEL = {"name": "Qwen/Qwen1.5-MoE-A2.7B-Chat", "source": "s3://models/qwen", "cache": {"size": "80Gi"}}


@pytest.fixture(scope="module")
def operator(kube: KubeAPI) -> Iterator[OperatorThread]:
    liveness = f"http://127.0.0.1:{process.free_port()}/healthz"
    overrides = {"resync_seconds": 1.0, "model_cache_unbound_seconds": UNBOUND_AFTER, "liveness_endpoint": liveness}
    with running_operator(kube, **overrides) as running:
        yield running


def cache_status(kube: KubeAPI, ns: str) -> dict[str, Any]:
    return ((kube.get(MS, ns, "qwen-moe") or {}).get("status") or {}).get("modelCache") or {}


def only(kube: KubeAPI, plural: str, ns: str) -> dict[str, Any]:
    items = kube.list(plural, ns)
    assert len(items) == 1, [item["metadata"]["name"] for item in items]
    return items[0]


def bind(kube: KubeAPI, ns: str, claim: str) -> None:
    patch_status(kube, "pvc", claim, ns, {"phase": "Bound", "capacity": {"storage": "80Gi"}})


def finish(kube: KubeAPI, ns: str, job: str, kind: str = "Complete", message: str = "") -> None:
    result = {"succeeded": 1} if kind == "Complete" else {"failed": 4}
    patch_status(kube, "job", job, ns, {**result, "conditions": [{"type": kind, "status": "True", "message": message}]})


def claim_of(deployment: dict[str, Any]) -> str:
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    return next(v["persistentVolumeClaim"]["claimName"] for v in volumes if v["name"] == "models")


def test_fill_once_then_serve_and_a_new_source_refills_before_switching(
    kube: KubeAPI, operator: OperatorThread
) -> None:
    ns = "cache"
    apply(kube, manifest("modelserver.yaml", namespace=ns, model=S3_MODEL, replicas=2))
    claim = wait_for(lambda: kube.list(CLAIMS, ns) and only(kube, CLAIMS, ns), what="the claim")
    job = wait_for(lambda: kube.list(JOBS, ns) and only(kube, JOBS, ns), what="the fill Job")
    server = kube.get(MS, ns, "qwen-moe")
    for child in (claim, job):
        [owner] = child["metadata"]["ownerReferences"]
        assert (owner["name"], owner["uid"], owner["controller"]) == ("qwen-moe", server["metadata"]["uid"], True)
    wait_for(lambda: cache_status(kube, ns).get("phase") == "Pending", what="Pending")
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe") is None  # nothing serves half-filled weights
    assert condition(kube.get(MS, ns, "qwen-moe"), "Ready")["reason"] == "ModelCachePending"

    bind(kube, ns, claim["metadata"]["name"])
    wait_for(lambda: cache_status(kube, ns).get("phase") == "Filling", what="Filling")
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe") is None
    finish(kube, ns, job["metadata"]["name"])
    dep = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment")
    assert claim_of(dep) == claim["metadata"]["name"] and "initContainers" not in dep["spec"]["template"]["spec"]
    wait_for(lambda: cache_status(kube, ns).get("phase") == "Ready", what="Ready")
    ready = condition(kube.get(MS, ns, "qwen-moe"), "ModelCacheReady")
    assert (ready["status"], ready["reason"]) == ("True", "ModelCacheReady")
    assert cache_status(kube, ns)["capacity"] == "80Gi"

    # A new source: a new claim and Job; the Deployment keeps the old claim until the new one is filled.
    apply(kube, manifest("modelserver.yaml", namespace=ns, model={**S3_MODEL, "source": "s3://models/qwen-v2"}))
    wait_for(lambda: len(kube.list(JOBS, ns)) == 2, what="the second fill Job")
    new_claim = next(c for c in kube.list(CLAIMS, ns) if c["metadata"]["name"] != claim["metadata"]["name"])
    new_job = next(j for j in kube.list(JOBS, ns) if j["metadata"]["name"] != job["metadata"]["name"])
    wait_for(lambda: cache_status(kube, ns).get("claimName") == new_claim["metadata"]["name"], what="new status")
    assert claim_of(kube.get(DEPLOYMENTS, ns, "qwen-moe")) == claim["metadata"]["name"]
    bind(kube, ns, new_claim["metadata"]["name"])
    finish(kube, ns, new_job["metadata"]["name"])
    wait_for(
        lambda: claim_of(kube.get(DEPLOYMENTS, ns, "qwen-moe")) == new_claim["metadata"]["name"],
        what="the Deployment on the new claim",
    )
    # The old cache goes once nothing is rendered against it.
    wait_for(lambda: [c["metadata"]["name"] for c in kube.list(CLAIMS, ns)] == [new_claim["metadata"]["name"]] or None,
             what="the old claim deleted")  # fmt: skip
    wait_for(lambda: [j["metadata"]["name"] for j in kube.list(JOBS, ns)] == [new_job["metadata"]["name"]] or None,
             what="the old Job deleted")  # fmt: skip
    # Reconciles do not recreate or rewrite the kept claim.
    kept = kube.get(CLAIMS, ns, new_claim["metadata"]["name"])
    kube.kubectl("label", "ms", "qwen-moe", "-n", ns, "poke=1")
    wait_for(lambda: (kube.get(MS, ns, "qwen-moe") or {}).get("metadata", {}).get("labels", {}).get("poke"), what="x")
    time.sleep(2.5)  # two resyncs at least
    assert kube.get(CLAIMS, ns, new_claim["metadata"]["name"])["metadata"]["uid"] == kept["metadata"]["uid"]


def degraded(kube: KubeAPI, ns: str) -> dict[str, Any] | None:
    cond = condition(kube.get(MS, ns, "qwen-moe"), "Degraded")
    return cond if cond and cond["status"] == "True" else None


def warnings(kube: KubeAPI, ns: str) -> set[str]:
    return {e.get("reason") for e in kube.list("v1/events", ns) if e.get("type") == "Warning"}


def test_a_failed_fill_is_reported_with_the_jobs_message(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "cache-failed"
    apply(kube, manifest("modelserver.yaml", namespace=ns, model=S3_MODEL))
    job = wait_for(lambda: kube.list(JOBS, ns) and only(kube, JOBS, ns), what="the fill Job")
    bind(kube, ns, only(kube, CLAIMS, ns)["metadata"]["name"])
    finish(kube, ns, job["metadata"]["name"], kind="Failed", message="Job has reached the specified backoff limit")
    cond = wait_for(lambda: degraded(kube, ns), what="Degraded")
    assert cond["reason"] == "ModelCacheFailed" and "backoff limit" in cond["message"]
    assert cache_status(kube, ns)["phase"] == "Failed"
    wait_for(lambda: "ModelCacheFailed" in warnings(kube, ns) or None, what="the Warning Event")
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe") is None
    assert kube.get("v1/services", ns, "qwen-moe") is not None  # the rest is applied all the same


def test_a_claim_that_never_binds_is_reported(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "cache-unbound"
    model = {**S3_MODEL, "cache": {"size": "80Gi", "storageClassName": "no-such-class"}}
    apply(kube, manifest("modelserver.yaml", namespace=ns, model=model))
    wait_for(lambda: cache_status(kube, ns).get("phase") == "Pending", what="Pending")
    cond = wait_for(lambda: degraded(kube, ns), what="Degraded", timeout=UNBOUND_AFTER + 10)
    assert cond["reason"] == "ModelCacheUnbound" and "storageClassName" in cond["message"]
    wait_for(lambda: "ModelCacheUnbound" in warnings(kube, ns) or None, what="the Warning Event")
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe") is None


def test_a_claim_of_that_name_made_by_someone_else_is_left_alone(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "cache-taken"
    server = manifest("modelserver.yaml", namespace=ns, model=S3_MODEL)
    name = model_cache.claim_name(ModelServerSpec.model_validate(server["spec"]), server="qwen-moe")
    foreign = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns}}
    foreign["spec"] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    apply(kube, foreign)
    apply(kube, server)
    cond = wait_for(lambda: degraded(kube, ns), what="Degraded")
    assert cond["reason"] == "NameTaken" and name in cond["message"]
    assert kube.list(JOBS, ns) == []  # never fill a claim someone else made
    assert "ownerReferences" not in kube.get(CLAIMS, ns, name)["metadata"]
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe") is None
