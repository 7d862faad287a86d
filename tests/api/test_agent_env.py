"""The operator -> agent contract (moelora.api.agent_env): what the operator renders into a pod is what the agent
parses back, field by field; a variable left out means its default."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import pytest

from moelora.agent.settings import from_env
from moelora.api import ModelServerSpec
from moelora.api.agent_env import ADMIN_KEY_FILE, AgentEnv, AgentEnvError
from moelora.operator.render import deployment, statefulset
from moelora.operator.settings import Settings
from moelora.vllm_plugin import admin_guard

POD = {"namespace": "team-a", "name": "srv-3", "uid": "0b7c-uid"}
SECRETS = {
    ("api-key", "token"): "client-s3cret",
    ("creds", "AWS_ACCESS_KEY_ID"): "id",
    ("creds", "AWS_SECRET_ACCESS_KEY"): "k",
}


def resolve(env: list[dict[str, Any]]) -> dict[str, str]:
    """What the kubelet hands the container: values as written, fieldRefs from the pod, secretKeyRefs from Secrets
    (an optional key that is missing leaves the variable out)."""
    resolved: dict[str, str] = {}
    for entry in env:
        if "value" in entry:
            resolved[entry["name"]] = entry["value"]
            continue
        source = entry["valueFrom"]
        if "fieldRef" in source:
            resolved[entry["name"]] = POD[source["fieldRef"]["fieldPath"].removeprefix("metadata.")]
        elif (key := (source["secretKeyRef"]["name"], source["secretKeyRef"]["key"])) in SECRETS:
            resolved[entry["name"]] = SECRETS[key]
        else:
            assert source["secretKeyRef"].get("optional"), entry
    return resolved


def agent_env(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    (agent,) = (c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == deployment.AGENT_CONTAINER)
    return list(agent["env"])


def test_the_agent_reads_back_every_field_the_operator_renders() -> None:
    spec = ModelServerSpec.model_validate(
        {
            "model": {"name": "org/tiny-moe", "source": "hf://org/tiny-moe"},
            "lora": {"maxLoraRank": 32, "targetModules": ["v_proj", "q_proj"]},
            "adapterCache": {"sizeLimit": "500M"},
            "s3": {"endpointUrl": "http://minio:9000", "region": "eu-west-1", "credentialsSecret": {"name": "creds"}},
            "apiKeySecret": {"name": "api-key", "key": "token"},
        }
    )
    settings = Settings(allowed_s3_endpoints=("https://a.example.com",), allowed_s3_buckets=("team-*", "shared"))
    rendered = deployment.deployment(spec, name="srv", namespace="team-a", settings=settings)
    placed = statefulset.statefulset(rendered, replicas=4)
    defaults = {field: info.get_default() for field, info in AgentEnv.model_fields.items()}
    expected: dict[str, Any] = {
        **defaults,
        "namespace": "team-a",
        "pod_name": "srv-3",
        "pod_uid": "0b7c-uid",
        "model_server": "srv",
        "base_model": "org/tiny-moe",
        "base_model_config": pathlib.Path(
            "/var/run/moelora/vllm-home/.cache/huggingface/hub/models--org--tiny-moe/snapshots/*/config.json"
        ),
        "max_lora_rank": 32,
        "target_modules": frozenset({"q_proj", "v_proj"}),
        "cache_bytes": 500_000_000,
        "python_malloc": "malloc",
        "malloc_arena_max": 2,
        "vllm_api_key": "client-s3cret",
        "allowed_s3_endpoints": ("https://a.example.com",),
        "allowed_s3_buckets": ("team-*", "shared"),
        "server_s3_endpoint": "http://minio:9000",
    }
    deployed = from_env(resolve(agent_env(rendered)))
    assert deployed.model_dump() == expected
    # The StatefulSet's pods are the same but for serving only their assigned adapters.
    assert from_env(resolve(agent_env(placed))).model_dump() == {**expected, "placement": True}
    # Every variable appears once, and none empty: the API server would drop it and the operator see drift.
    names = [entry["name"] for entry in agent_env(placed)]
    assert len(names) == len(set(names)) and all(entry.get("value") != "" for entry in agent_env(placed))


def test_a_bare_model_server_leaves_the_rest_to_defaults() -> None:
    spec = ModelServerSpec.model_validate({"model": {"name": "org/tiny-moe"}})
    rendered = agent_env(deployment.deployment(spec, name="srv", namespace="ns", settings=Settings()))
    parsed = from_env(resolve(rendered))
    assert parsed.target_modules == frozenset() and parsed.vllm_api_key is None and parsed.server_s3_endpoint is None
    assert parsed.allowed_s3_endpoints == () and not parsed.placement
    assert not any(entry["name"].startswith("AWS_") for entry in rendered)


def test_every_field_survives_rendering_and_parsing() -> None:
    changed: dict[str, Any] = {
        "pod_name": "srv-3",
        "namespace": "team-a",
        "pod_uid": "0b7c-uid",
        "model_server": "srv",
        "base_model": "org/m",
        "base_model_config": pathlib.Path("/models/config.json"),
        "max_lora_rank": 8,
        "target_modules": frozenset({"o_proj", "gate_proj"}),
        "vllm_url": "https://vllm.local:9",
        "cache_dir": pathlib.Path("/cache"),
        "cache_bytes": 12345,
        "port": 9090,
        "python_malloc": "malloc",
        "malloc_arena_max": 3,
        "admin_key_file": pathlib.Path("/k/key"),
        "vllm_api_key": "client-s3cret",
        "allowed_s3_endpoints": ("https://a.example.com", "https://b.example.com"),
        "allowed_s3_buckets": ("b1",),
        "server_s3_endpoint": "http://minio:9000",
        "max_adapter_bytes": 99,
        "resync_seconds": 1.5,
        "poll_seconds": 0.25,
        "download_workers": 3,
        "list_timeout_seconds": 7.0,
        "download_timeout_seconds": 70.0,
        "min_bytes_per_second": 10,
        "rate_window_seconds": 2.5,
        "endpoint_workers": 2,
        "s3_read_timeout_seconds": 3.0,
        "ready_wait_seconds": 11.0,
        "placement": True,
        "load_window_seconds": 60.0,
        "resolve_seconds": 42.0,
    }
    assert set(changed) == set(AgentEnv.model_fields), "a new field needs a value here"
    assert not [field for field, value in changed.items() if value == AgentEnv.model_fields[field].get_default()]
    env = AgentEnv(**changed)
    secret = {"vllm_api_key": {"secretKeyRef": {"name": "api-key", "key": "token"}}}
    assert AgentEnv.parse(resolve(env.entries(value_from=secret))) == env


def test_a_missing_variable_means_the_default_and_required_ones_are_named() -> None:
    required = {"MOELORA_NAMESPACE": "ns", "MOELORA_POD_NAME": "p", "MOELORA_MODEL_SERVER": "s"}
    required |= {"MOELORA_BASE_MODEL": "m", "MOELORA_MAX_LORA_RANK": "16"}
    parsed = AgentEnv.parse(required)
    for field, info in AgentEnv.model_fields.items():
        if AgentEnv.variable(field) not in required:
            assert getattr(parsed, field) == info.get_default(), field
    assert parsed.admin_key_file == pathlib.Path(ADMIN_KEY_FILE)
    for name in required:
        with pytest.raises(AgentEnvError, match=f"{name} is required and empty"):
            AgentEnv.parse({**required, name: "  "})


def test_the_vllm_plugins_stdlib_copy_of_the_key_file_agrees() -> None:
    assert admin_guard.DEFAULT_KEY_FILE == ADMIN_KEY_FILE
    assert admin_guard.KEY_FILE_ENV == AgentEnv.variable("admin_key_file")
