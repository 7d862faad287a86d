"""Pods that download the weights themselves: disk bounds from spec.model.sizeHint (none without it), and the S3
streamer's rendering."""

from __future__ import annotations

from typing import Any

import pytest

from moelora.operator.errors import SpecProblem
from moelora.operator.render.deployment import deployment
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec


def pod(**spec: Any) -> dict[str, Any]:
    obj = deployment(make_spec(**spec), name="srv", namespace="ns", settings=Settings())
    k8s_valid(obj)
    return obj["spec"]["template"]["spec"]


def volume(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in pod_spec["volumes"] if v["name"] == name)


def vllm(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == "vllm")


def test_without_a_hint_nothing_is_bounded() -> None:
    s3 = pod(model={"name": "org/m", "source": "s3://models/m"})
    assert volume(s3, "models")["emptyDir"] == {}
    hf = pod(model={"name": "org/m"})
    assert volume(hf, "home")["emptyDir"] == {}
    for pod_spec in (s3, hf):
        assert "ephemeral-storage" not in vllm(pod_spec).get("resources", {}).get("requests", {})


def test_s3_hint_bounds_the_model_volume_and_requests_the_disk() -> None:
    pod_spec = pod(model={"name": "org/m", "source": "s3://models/m", "sizeHint": "70Gi"})
    assert volume(pod_spec, "models")["emptyDir"] == {"sizeLimit": "70Gi"}
    assert vllm(pod_spec)["resources"]["requests"]["ephemeral-storage"] == "70Gi"


def test_hf_hint_bounds_home_where_the_hub_downloads() -> None:
    pod_spec = pod(model={"name": "org/m", "sizeHint": "70Gi"})
    assert volume(pod_spec, "home")["emptyDir"] == {"sizeLimit": "70Gi"}
    assert vllm(pod_spec)["resources"]["requests"]["ephemeral-storage"] == "70Gi"


def test_the_users_own_ephemeral_storage_wins() -> None:
    pod_spec = pod(model={"name": "org/m", "sizeHint": "70Gi"}, resources={"requests": {"ephemeral-storage": "100Gi"}})
    assert vllm(pod_spec)["resources"]["requests"]["ephemeral-storage"] == "100Gi"


def test_a_hint_on_a_mounted_claim_changes_nothing() -> None:
    pod_spec = pod(model={"name": "org/m", "source": "pvc://weights/m", "sizeHint": "70Gi"})
    assert "ephemeral-storage" not in vllm(pod_spec).get("resources", {}).get("requests", {})


def test_streamer_reads_s3_directly_with_the_pods_s3_access() -> None:
    pod_spec = pod(
        model={"name": "org/m", "source": "s3://models/m", "loadFormat": "streamer", "sizeHint": "70Gi"},
        s3={"endpointUrl": "http://s3.local:9000", "credentialsSecret": {"name": "creds"}},
    )
    assert "initContainers" not in pod_spec
    assert all(v["name"] != "models" for v in pod_spec["volumes"])
    container = vllm(pod_spec)
    args = container["args"]
    assert args[args.index("--model") + 1] == "s3://models/m"
    assert args[args.index("--load-format") + 1] == "runai_streamer"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["RUNAI_STREAMER_S3_ENDPOINT"] == env["AWS_ENDPOINT_URL"] == "http://s3.local:9000"
    assert env["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "creds"
    assert "ephemeral-storage" not in container.get("resources", {}).get("requests", {})
    agent = next(c for c in pod_spec["containers"] if c["name"] == "agent")
    assert all(e["name"] != "MOELORA_BASE_MODEL_CONFIG" for e in agent["env"])  # no local copy to point at


def test_streamer_refuses_a_load_format_in_engine_args() -> None:
    with pytest.raises(SpecProblem) as caught:
        pod(
            model={"name": "org/m", "source": "s3://models/m", "loadFormat": "streamer"},
            engineArgs=["--load-format", "safetensors"],
        )
    assert caught.value.reason == "ManagedEngineFlag"
