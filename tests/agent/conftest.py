"""Fixtures of the agent's tests: a real moto S3 server on loopback, and adapter files written like peft does."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import numpy as np
import pytest
import safetensors.numpy

BASE_MODEL = "moelora-test/tiny-llama"
KEYS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key-value"}


def adapter_files(*, rank: int = 8, base: str = BASE_MODEL, modules: list[str] | str | None = None,
                  hidden: int = 32, seed: int = 0, extra_bytes: int = 0) -> dict[str, bytes]:
    """adapter_config.json and adapter_model.safetensors shaped like a peft LoRA save (random weights)."""
    modules = ["q_proj", "v_proj"] if modules is None else modules
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": modules,
              "base_model_name_or_path": base, "bias": "none", "task_type": "CAUSAL_LM"}
    rng = np.random.default_rng(seed)
    tensors = {}
    for module in (modules if isinstance(modules, list) else ["q_proj"]):
        prefix = f"base_model.model.model.layers.0.self_attn.{module}"
        tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((rank, hidden)).astype(np.float32)
        tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((hidden, rank)).astype(np.float32)
    if extra_bytes:
        tensors["padding"] = rng.integers(0, 255, extra_bytes, dtype=np.uint8)
    return {"adapter_config.json": json.dumps(config).encode(),
            "adapter_model.safetensors": safetensors.numpy.save(tensors)}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server for the whole session (started here until moelora.local.s3 offers one)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> str:
    """The pod's environment as the operator renders it for a ModelServer with spec.s3 and a Secret."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    for key, value in KEYS.items():
        monkeypatch.setenv(key, value)
    return s3_endpoint


def s3_client(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"])


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"adapters-{uuid.uuid4().hex[:12]}"
    s3_client(s3_endpoint).create_bucket(Bucket=name)
    return name


def upload(endpoint: str, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    client = s3_client(endpoint)
    for relpath, data in files.items():
        client.put_object(Bucket=bucket, Key=prefix + relpath, Body=data)
