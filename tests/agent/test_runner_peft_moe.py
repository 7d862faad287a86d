"""The agent's loop with a peft fused-expert adapter (vLLM down): judged before the weights come, and prepared as
its per-expert rewrite, which is the path the agent will hand vLLM."""

from __future__ import annotations

import json
import pathlib
import threading
from collections.abc import Iterator

import pytest

from moelora.agent import peft_moe
from moelora.agent.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.agent.settings import Settings
from moelora.agent.vllm import VllmClient
from moelora.local import process

from .conftest import BASE_MODEL, POD, MemoryDesired, MemoryKube, adapter_files, eventually, upload
from .test_peft_moe import _peft_adapter


@pytest.fixture
def agent(s3_env: str, tmp_path: pathlib.Path) -> Iterator[tuple[Agent, MemoryDesired, MemoryKube]]:
    settings = Settings(
        namespace="ns",
        pod_name=POD,
        model_server="srv",
        base_model=BASE_MODEL,
        max_lora_rank=16,
        target_modules=frozenset(),
        vllm_url=f"http://127.0.0.1:{process.free_port()}",
        cache_dir=tmp_path / "cache",
        cache_bytes=1 << 30,
        port=0,
        poll_seconds=0.2,
    )
    kube, desired = MemoryKube(), MemoryDesired()
    loop = Agent(
        settings=settings,
        kube=kube,
        desired=desired,
        vllm=VllmClient(base_url=settings.vllm_url, attempts=1),
        metrics=Metrics(),
    )
    desired.on_change = loop.wake.set
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    yield loop, desired, kube
    loop.stop()
    thread.join(timeout=10)


def test_unservable_target_parameters_fail_before_the_weights(
    agent: tuple[Agent, MemoryDesired, MemoryKube], s3_env: str, bucket: str
) -> None:
    loop, desired, kube = agent
    files = adapter_files(extra_bytes=1 << 20)
    config = json.loads(files["adapter_config.json"])
    files["adapter_config.json"] = json.dumps(dict(config, target_parameters=["mlp.router.weight"])).encode()
    upload(s3_env, bucket, "router/", files)
    desired.synced.set()
    desired.put("router", {"source": {"uri": f"s3://{bucket}/router/"}})
    eventually(lambda: "router" in kube.status and kube.status["router"][0].reason == "ConfigInvalid")
    assert not any(loop.settings.cache_dir.iterdir())


def test_fused_expert_adapter_is_prepared_as_its_rewrite(
    agent: tuple[Agent, MemoryDesired, MemoryKube], s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    loop, desired, kube = agent
    made = tmp_path / "peft"
    _peft_adapter(made, hidden=16, inter=8)
    config = json.loads((made / "adapter_config.json").read_text())
    (made / "adapter_config.json").write_text(json.dumps(dict(config, base_model_name_or_path=BASE_MODEL)))
    upload(s3_env, bucket, "fused/", {p.name: p.read_bytes() for p in made.iterdir()})
    desired.synced.set()
    desired.put("fused", {"source": {"uri": f"s3://{bucket}/fused/"}})
    eventually(lambda: (r := loop.records.get("uid-fused")) is not None and r.path is not None)
    path = pathlib.Path(loop.records["uid-fused"].path)  # type: ignore[arg-type]
    assert path.name == peft_moe.CONVERTED_DIR and path.parent.parent == loop.settings.cache_dir
    assert (path / "adapter_model.safetensors").is_file()
    assert json.loads((path / "adapter_config.json").read_text())["target_parameters"] is None
    assert peft_moe.cache_version(str(path)) == path.parent.name
