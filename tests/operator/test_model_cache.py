"""The shared model cache's builders (claim, fill Job, the Deployment that mounts it) and its state machine, judged
from the claim's and the Job's status as a cluster would write them."""

from __future__ import annotations

import datetime
from typing import Any

import pydantic
import pytest

from moelora.api import ModelCachePhase
from moelora.operator.render import model_cache, naming
from moelora.operator.render.children import Surroundings, desired_children
from moelora.operator.render.deployment import deployment
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec

UNBOUND = 600.0
NOW = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=datetime.UTC)
S3 = {"name": "org/tiny-moe", "source": "s3://models/tiny", "cache": {"size": "80Gi"}}
HF = {"name": "org/tiny-moe", "cache": {"size": "80Gi", "storageClassName": "shared-fs"}}


def spec_with(model: dict[str, Any], **rest: Any) -> Any:
    return make_spec(model=model, **rest)


def pod_of(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def test_claim_is_valid_and_named_by_the_servers_name_and_a_digest() -> None:
    spec = spec_with(HF)
    claim = model_cache.claim(spec, server="srv", namespace="ns")
    k8s_valid(claim)
    assert claim["metadata"]["name"].startswith("srv-model-cache-")
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "80Gi"}},
        "volumeMode": "Filesystem",
        "storageClassName": "shared-fs",
    }
    assert claim["metadata"]["annotations"][model_cache.ANNOTATION_SOURCE] == "hf://org/tiny-moe"
    assert claim["metadata"]["labels"][model_cache.LABEL_COMPONENT] == "model-cache"


def test_a_new_source_or_size_is_a_new_claim_and_job_other_fields_are_not() -> None:
    base = spec_with(S3)
    names = {model_cache.claim_name(base, server="srv"), model_cache.job_name(base, server="srv")}
    for changed in (
        {**S3, "source": "s3://models/other"},
        {**S3, "cache": {"size": "90Gi"}},
        {**S3, "cache": {"size": "80Gi", "storageClassName": "fast"}},
    ):
        other = spec_with(changed)
        assert model_cache.claim_name(other, server="srv") not in names
        assert model_cache.job_name(other, server="srv") not in names
    same = spec_with(S3, replicas=7, engineArgs=["--max-model-len=8192"])
    assert model_cache.claim_name(same, server="srv") in names


def test_long_server_names_stay_within_a_label_value_and_apart() -> None:
    a, b = "a" * 63, "a" * 62 + "b"
    for name in (a, b):
        job = model_cache.fetch_job(spec_with(S3), server=name, namespace="ns", settings=Settings())
        k8s_valid(job)
        assert len(job["metadata"]["name"]) <= 63
    assert model_cache.job_name(spec_with(S3), server=a) != model_cache.job_name(spec_with(S3), server=b)


def test_s3_fill_job_runs_the_agents_fetch_with_the_servers_s3_access(settings: Settings) -> None:
    spec = spec_with(
        S3,
        s3={"endpointUrl": "http://s3.local:9000", "credentialsSecret": {"name": "s3-creds"}},
        imagePullSecrets=[{"name": "regcred"}],
    )
    job = model_cache.fetch_job(spec, server="srv", namespace="ns", settings=settings)
    k8s_valid(job)
    pod = pod_of(job)
    (container,) = pod["containers"]
    assert container["image"] == "example.com/agent:1"
    assert container["command"] == ["python3", "-m", "moelora.agent", "fetch-model"]
    assert container["args"] == ["s3://models/tiny", "/models"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["AWS_ENDPOINT_URL_S3"] == "http://s3.local:9000"
    assert env["AWS_ACCESS_KEY_ID"] == {
        "secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID", "optional": False}
    }
    claim = model_cache.claim_name(spec, server="srv")
    assert {"name": "models", "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Not the server's selector: neither its Service nor its Deployment may count the fill pod.
    assert naming.LABEL_SERVER not in job["spec"]["template"]["metadata"]["labels"]
    assert naming.LABEL_MANAGED_BY not in job["spec"]["template"]["metadata"]["labels"]


def test_hf_fill_job_downloads_with_the_hub_in_the_server_image_and_the_token(settings: Settings) -> None:
    spec = spec_with({**HF, "tokenSecret": {"name": "hf", "key": "token"}})
    job = model_cache.fetch_job(spec, server="srv", namespace="ns", settings=settings)
    k8s_valid(job)
    (container,) = pod_of(job)["containers"]
    assert container["image"] == "example.com/server:1"
    assert container["command"][:2] == ["python3", "-c"] and "snapshot_download" in container["command"][2]
    assert container["args"] == ["org/tiny-moe", "/models"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HOME"] == "/tmp"


@pytest.mark.parametrize("model", [S3, HF], ids=["s3", "hf"])
def test_the_deployment_mounts_the_filled_claim_read_only_and_downloads_nothing(
    settings: Settings, model: dict[str, Any]
) -> None:
    spec = spec_with(model)
    claim = model_cache.claim_name(spec, server="srv")
    obj = deployment(spec, name="srv", namespace="ns", settings=settings, model_claim=claim)
    k8s_valid(obj)
    pod = pod_of(obj)
    assert "initContainers" not in pod
    assert {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}} in pod["volumes"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in vllm["volumeMounts"]
    assert vllm["args"][:2] == ["--model", "/models"]
    # The agent checks adapters against the cached config.json, on the same read-only claim.
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in agent["volumeMounts"]
    assert {"name": "MOELORA_BASE_MODEL_CONFIG", "value": "/models/config.json"} in agent["env"]


def observed(
    *,
    claim_phase: str | None = None,
    job: dict[str, Any] | None = None,
    age: float = 0,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    created = (NOW - datetime.timedelta(seconds=age)).isoformat().replace("+00:00", "Z")
    claim = None
    if claim_phase is not None:
        claim = {"metadata": {"creationTimestamp": created}, "status": {"phase": claim_phase}}
        if claim_phase == "Bound":
            claim["status"]["capacity"] = {"storage": "80Gi"}
    return claim, job


def job_with(kind: str | None, message: str = "") -> dict[str, Any]:
    conditions = [{"type": kind, "status": "True", "message": message}] if kind else []
    return {"metadata": {}, "status": {"active": 0 if kind else 1, "conditions": conditions}}


@pytest.mark.parametrize(
    ("claim_phase", "job", "age", "phase", "problem"),
    [
        (None, None, 0, ModelCachePhase.PENDING, None),
        ("Pending", job_with(None), 0, ModelCachePhase.PENDING, None),
        ("Pending", job_with(None), UNBOUND, ModelCachePhase.PENDING, "ModelCacheUnbound"),
        ("Bound", job_with(None), 10_000, ModelCachePhase.FILLING, None),
        ("Bound", job_with("Complete"), 0, ModelCachePhase.READY, None),
        ("Bound", job_with("Failed", "Job has reached the specified backoff limit"), 0, ModelCachePhase.FAILED,
         "ModelCacheFailed"),
        ("Lost", job_with("Complete"), 0, ModelCachePhase.FAILED, "ModelCacheLost"),
    ],
    ids=["nothing-yet", "unbound", "unbound-too-long", "filling", "ready", "failed", "lost"],
)  # fmt: skip
def test_state_from_the_claim_and_the_job(
    claim_phase: str | None, job: dict[str, Any] | None, age: float, phase: ModelCachePhase, problem: str | None
) -> None:
    claim, job = observed(claim_phase=claim_phase, job=job, age=age)
    state = model_cache.state(spec_with(S3), server="srv", claim=claim, job=job, now=NOW, unbound_after=UNBOUND)
    assert state.status.phase == phase
    assert (state.problem.reason if state.problem else None) == problem
    assert state.ready == (phase == ModelCachePhase.READY)
    if phase == ModelCachePhase.READY:
        assert state.status.capacity == "80Gi"


def test_a_failed_fill_carries_the_jobs_message() -> None:
    claim, job = observed(claim_phase="Bound", job=job_with("Failed", "Job has reached the specified backoff limit"))
    state = model_cache.state(spec_with(S3), server="srv", claim=claim, job=job, now=NOW, unbound_after=UNBOUND)
    assert state.problem is not None and "backoff limit" in state.problem.message
    assert "backoff limit" in state.status.message


def kinds(children: list[dict[str, Any]]) -> list[str]:
    return [child["kind"] for child in children]


def test_children_hold_the_deployment_back_until_the_cache_is_ready(settings: Settings) -> None:
    spec = spec_with(S3)
    render = {"name": "srv", "namespace": "ns", "settings": settings, "kernel_bundle": None}
    filling = model_cache.state(spec, server="srv", claim=None, job=None, now=NOW, unbound_after=UNBOUND)
    children = desired_children(spec, **render, surroundings=Surroundings(model_cache=filling))
    assert kinds(children) == ["PersistentVolumeClaim", "Job", "Service"]
    claim, job = observed(claim_phase="Bound", job=job_with("Complete"))
    ready = model_cache.state(spec, server="srv", claim=claim, job=job, now=NOW, unbound_after=UNBOUND)
    children = desired_children(spec, **render, surroundings=Surroundings(model_cache=ready))
    assert kinds(children) == ["PersistentVolumeClaim", "Job", "Deployment", "Service"]
    for child in children:
        k8s_valid(child)


@pytest.mark.parametrize(
    "model",
    [
        {"name": "org/m", "source": "pvc://weights/m", "cache": {"size": "1Gi"}},
        {"name": "org/m", "source": "s3://models/m", "loadFormat": "streamer", "cache": {"size": "1Gi"}},
        {"name": "org/m", "loadFormat": "streamer"},
        {"name": "org/m", "cache": {"size": "1Gi", "accessModes": ["ReadOnlyMany"]}},
    ],
    ids=["pvc-cached", "streamer-cached", "streamer-hf", "read-only-many"],
)
def test_refused_combinations(model: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        spec_with(model)


def test_a_claim_made_again_after_its_fill_is_filled_again() -> None:
    claim, _ = observed(claim_phase="Bound", age=10)
    job = {**job_with("Complete"), "metadata": {"creationTimestamp": "2030-01-01T11:00:00Z"}}
    state = model_cache.state(spec_with(S3), server="srv", claim=claim, job=job, now=NOW, unbound_after=UNBOUND)
    assert state.stale_job and state.status.phase == ModelCachePhase.PENDING and not state.ready
