"""Hostile adapters end to end: each is refused by the agent with its own reason before vLLM loads anything, while
vLLM stays healthy and a good adapter answers throughout.

Its own one-replica stack (not the shared one of conftest.py): the agent gets MOELORA_BASE_MODEL_CONFIG, pointing at
the generated model's config.json, as the operator will render it.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import pickle
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SERVER = "hostile"
REPO = pathlib.Path(__file__).resolve().parents[2]
Q = "base_model.model.model.layers.0.self_attn.q_proj"


def _local(name: str) -> Any:
    return importlib.import_module(f"moelora.local.{name}")  # by name only: the local stack's modules may move


def _safetensors(header: dict[str, Any], data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _hostile(good: pathlib.Path, root: pathlib.Path) -> dict[str, tuple[dict[str, bytes], str]]:
    """name -> (files, expected reason): the attacks the issue reports, each in its own adapter."""
    config = json.loads((good / "adapter_config.json").read_text())
    config_bytes = json.dumps(config).encode()
    weights = (good / "adapter_model.safetensors").read_bytes()
    zero_size = {
        f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_{ab}.weight": {
            "dtype": "F32",
            "shape": [0, 8],
            "data_offsets": [0, 0],
        }
        for i in range(50_000)
        for ab in "AB"
    }
    wrong_rank = dict(config, r=4)
    return {
        "h-pickle": (
            {"adapter_config.json": config_bytes, "adapter_model.safetensors": pickle.dumps({Q: [0.0] * 64})},
            "WeightsInvalid",
        ),
        "h-zero-size": (
            {"adapter_config.json": config_bytes, "adapter_model.safetensors": _safetensors(zero_size)},
            "WeightsMismatch",
        ),
        "h-newline": (
            {
                "adapter_config.json": config_bytes,
                "adapter_model.safetensors": _safetensors(
                    {f"{Q}\nFAKE.lora_A.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
                ),
            },
            "WeightsInvalid",
        ),
        "h-dtype": (
            {
                "adapter_config.json": config_bytes,
                "adapter_model.safetensors": _safetensors(
                    {f"{Q}.lora_A.weight": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8
                ),
            },
            "WeightsInvalid",
        ),
        "h-rank": (
            {"adapter_config.json": json.dumps(wrong_rank).encode(), "adapter_model.safetensors": weights},
            "WeightsMismatch",
        ),
        "h-deep-config": (
            {
                "adapter_config.json": b'{"r": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
                "adapter_model.safetensors": weights,
            },
            "ConfigInvalid",
        ),
        "h-huge-int": (
            {"adapter_config.json": b'{"r": ' + b"9" * 10_000 + b"}", "adapter_model.safetensors": weights},
            "ConfigInvalid",
        ),
    }


@pytest.fixture(scope="module")
def hostile_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    stack, manifests = _local("stack"), _local("manifests")
    root = tmp_path_factory.mktemp("hostile")
    # The agent runs this checkout's code, not whatever the venv's editable install points at.
    code = ":".join(str(REPO / folder) for folder in ("operator", "image", "kernels"))
    env = {
        "MOELORA_POLL_SECONDS": "1",
        "MOELORA_BASE_MODEL_CONFIG": str(root / "model" / "config.json"),
        "PYTHONPATH": code,
    }
    with stack.Stack(root=root, agent_env=env) as running:
        running.apply(manifests.model_server(name=SERVER, s3_endpoint=running.s3.endpoint_url, replicas=1))
        running.wait_pods(SERVER, replicas=1, timeout=400)
        yield running


class Watch(threading.Thread):
    """Polls vLLM's /health and a completion from the good adapter while the hostile ones are handled."""

    def __init__(self, url: str, adapter: str) -> None:
        super().__init__(daemon=True)
        self.url, self.adapter = url, adapter
        self.stop = threading.Event()
        self.problems: list[str] = []
        self.slowest = 0.0
        self.rounds = 0

    def run(self) -> None:
        vllm = _local("vllm")
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=10) as response:
                    if response.status != 200:
                        self.problems.append(f"/health {response.status}")
                vllm.complete(url=self.url, model=self.adapter, prompt="hi", max_tokens=2)
            except Exception as error:  # noqa: BLE001 - every failure is a finding
                self.problems.append(f"{type(error).__name__}: {error}")
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.rounds += 1
            time.sleep(0.2)


def test_hostile_adapters_are_refused_before_vllm_and_disturb_nothing(hostile_stack: Any) -> None:
    manifests, models, s3 = _local("manifests"), _local("models"), _local("s3")
    local = hostile_stack
    good = models.make_adapter(
        model_dir=local.model_dir, path=local.root / "good", base_model_name=manifests.BASE_MODEL_NAME, rank=8
    )
    local.apply(manifests.adapter(name="good", model_server=SERVER, uri=local.upload_adapter(source=good, name="good")))
    local.wait_adapter("good", phase="Loaded", replicas=1, timeout=120)
    (url,) = local.vllm_urls(SERVER)
    watch = Watch(url, "good")
    watch.start()
    cases = _hostile(good, local.root)
    try:
        for name, (files, _) in cases.items():
            uri = manifests.adapter_uri(name)
            for relpath, body in files.items():
                s3.put_object(server=local.s3, uri=uri + relpath, body=body)
            local.apply(manifests.adapter(name=name, model_server=SERVER, uri=uri))
        bodies = {name: local.wait_adapter(name, phase="Failed", timeout=120) for name in cases}
        time.sleep(2)  # a few more rounds of the watch after the last refusal
    finally:
        watch.stop.set()
        watch.join(timeout=30)
    for name, (_, reason) in cases.items():
        replicas = bodies[name]["status"]["replicas"]
        assert {r.get("reason") for r in replicas.values()} == {reason}, json.dumps(bodies[name]["status"])
        for replica in replicas.values():  # untrusted names arrive escaped, never as raw control characters
            assert str(replica.get("lastError", "")).isprintable(), replica
    served = _local("vllm").models(url=url)
    assert not set(cases) & set(served)  # none reached vLLM
    assert watch.rounds > 5 and not watch.problems, watch.problems[:5]
