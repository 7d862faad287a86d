"""The objects the local stack applies: a ModelServer for the tiny model on the CPU, its adapters, the S3 Secret.

Pure builders (dicts in, dicts out). examples/local/ holds the same objects as YAML for people to read and apply;
a unit test keeps the two in step.
"""

from __future__ import annotations

import base64
from typing import Any

from moelora.api import API_VERSION
from moelora.local import moe as moe_model
from moelora.local import vllm_server

BASE_MODEL_NAME = "moelora/tiny-llama"
MODEL_URI = "s3://models/tiny-llama/"
# The MoE variant: a tiny Qwen3-MoE (moelora.local.moe) served through the moelora vLLM plugin, since vLLM has no
# CPU path for MoE + LoRA of its own.
MOE_BASE_MODEL_NAME = "moelora/tiny-qwen3-moe"
MOE_MODEL_URI = "s3://models/tiny-qwen3-moe/"
ADAPTERS_BUCKET = "adapters"
S3_SECRET = "local-s3"

# What the ModelServer's env may carry of vllm_server.CPU_ENV: the operator sets these two itself (and refuses them).
_OPERATOR_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_NO_USAGE_STATS"}


def s3_secret(*, access_key_id: str, secret_access_key: str, name: str = S3_SECRET) -> dict[str, Any]:
    """A Secret with S3 keys, base64 in `data` (kmock keeps `stringData` as posted instead of folding it into
    `data` like a real API server, and readers of Secrets look at `data`)."""

    def b64(value: str) -> str:
        return base64.b64encode(value.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": {"AWS_ACCESS_KEY_ID": b64(access_key_id), "AWS_SECRET_ACCESS_KEY": b64(secret_access_key)},
    }


def model_server(
    *,
    name: str,
    s3_endpoint: str,
    replicas: int = 1,
    max_loras: int = 4,
    max_lora_rank: int = 16,
    max_cpu_loras: int | None = None,
    cache_size: str = "1Gi",
    moe: bool = False,
) -> dict[str, Any]:
    """A ModelServer serving the generated tiny model from local S3 on the CPU (gpus: 0); with `moe`, the tiny
    Qwen3-MoE with the moelora kernel."""
    lora: dict[str, Any] = {"maxLoras": max_loras, "maxLoraRank": max_lora_rank}
    if max_cpu_loras is not None:
        lora["maxCpuLoras"] = max_cpu_loras
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ModelServer",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": MOE_BASE_MODEL_NAME if moe else BASE_MODEL_NAME,
                "source": (MOE_MODEL_URI if moe else MODEL_URI).rstrip("/"),
            },
            "replicas": replicas,
            "gpus": 0,
            "lora": lora,
            "engineArgs": list(vllm_server.CPU_ENGINE_ARGS),
            "env": [
                {"name": key, "value": value} for key, value in vllm_server.CPU_ENV.items() if key not in _OPERATOR_ENV
            ],
            "s3": {"endpointUrl": s3_endpoint, "region": "us-east-1", "credentialsSecret": {"name": S3_SECRET}},
            "adapterCache": {"sizeLimit": cache_size},
        },
    }
    if moe:
        body["spec"]["kernels"] = {"implementation": "moelora"}
        lora["targetModules"] = [*moe_model.ATTENTION_MODULES, *moe_model.EXPERT_MODULES]
    return body


def adapter(*, name: str, model_server: str, uri: str, pin: dict[str, str] | None = None) -> dict[str, Any]:
    """A LoRAAdapter of `model_server` whose files are at `uri`."""
    spec: dict[str, Any] = {"modelServer": model_server, "source": {"uri": uri}}
    if pin:
        spec["pin"] = pin
    return {"apiVersion": API_VERSION, "kind": "LoRAAdapter", "metadata": {"name": name}, "spec": spec}


def adapter_uri(name: str) -> str:
    return f"s3://{ADAPTERS_BUCKET}/{name}/"
