"""Through faults with real parts: moto S3, a fault proxy dripping one tenant's endpoint, a real vLLM. Good adapters
are Loaded within their normal time + 5 s however many adapters drip (issue 17's hanging endpoint)."""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.agent.serve.vllm import VllmClient
from moelora.agent.settings import Settings
from moelora.local.faults import Drip, FaultProxy, Rule

from .conftest import KEYS, POD, VLLM_BASE_NAME, VLLM_MAX_RANK, MemoryDesired, MemoryKube, eventually, s3_client

pytestmark = pytest.mark.slow
DRIPPING = 8  # as many as the agent has download workers: the old pool would have been all theirs


def upload_dir(endpoint: str, bucket: str, prefix: str, source: pathlib.Path) -> None:
    client = s3_client(endpoint)
    for path in source.iterdir():
        client.put_object(Bucket=bucket, Key=prefix + path.name, Body=path.read_bytes())


@pytest.fixture
def proxy(s3_env: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_env) as running:
        yield running


def start(clean_vllm: str, cache: pathlib.Path, proxy: FaultProxy) -> tuple[Agent, MemoryDesired, MemoryKube]:
    settings = Settings(
        namespace="ns",
        pod_name=POD,
        model_server="srv",
        base_model=VLLM_BASE_NAME,
        max_lora_rank=VLLM_MAX_RANK,
        target_modules=frozenset(),
        vllm_url=clean_vllm,
        cache_dir=cache,
        cache_bytes=1 << 30,
        port=0,
        poll_seconds=0.3,
        allowed_s3_endpoints=(proxy.url,),
        # Defaults except the listing deadline, kept above the test's length so the drips hold their slots.
        list_timeout_seconds=120.0,
    )
    kube, desired = MemoryKube(), MemoryDesired()
    kube.secrets["tenant"] = dict(KEYS)
    agent = Agent(
        settings=settings, kube=kube, desired=desired, vllm=VllmClient(base_url=clean_vllm), metrics=Metrics()
    )
    desired.on_change = agent.wake.set
    desired.synced.set()
    threading.Thread(target=agent.run, daemon=True).start()
    return agent, desired, kube


def time_to_loaded(desired: MemoryDesired, kube: MemoryKube, names: list[str], sources: dict[str, Any]) -> float:
    started = time.monotonic()
    for name in names:
        desired.put(name, {"source": sources[name]})
    eventually(lambda: all(name in kube.status and kube.status[name][0].loaded for name in names), timeout=60)
    return time.monotonic() - started


def test_good_adapters_load_in_their_normal_time_beside_a_dripping_endpoint(
    s3_env: str, clean_vllm: str, bucket: str, tiny: dict[str, Any], tmp_path: pathlib.Path, proxy: FaultProxy
) -> None:
    for i in range(3):
        upload_dir(s3_env, bucket, f"good{i}/", tiny["v1" if i % 2 else "v2"])
    for i in range(DRIPPING):
        upload_dir(s3_env, bucket, f"drip{i}/", tiny["v1"])
    proxy.rules.append(Rule(match="/drip", fault=Drip(bytes_per_step=1, step_seconds=20)))  # issue 17's endpoint
    dripping = {"endpointUrl": proxy.url, "credentialsSecret": {"name": "tenant"}}
    sources = {f"good{i}": {"uri": f"s3://{bucket}/good{i}/"} for i in range(3)}
    sources |= {f"drip{i}": {"uri": f"s3://{bucket}/drip{i}/", **dripping} for i in range(DRIPPING)}

    agent, desired, kube = start(clean_vllm, tmp_path / "alone", proxy)
    normal = time_to_loaded(desired, kube, ["good0"], sources)
    agent.stop()
    for name in VllmClient(base_url=clean_vllm).adapters():
        VllmClient(base_url=clean_vllm).unload(name=name)

    agent, desired, kube = start(clean_vllm, tmp_path / "faults", proxy)
    for i in range(DRIPPING):
        desired.put(f"drip{i}", {"source": sources[f"drip{i}"]})
    time.sleep(1.0)  # the drips have taken what they can
    beside = time_to_loaded(desired, kube, ["good1", "good2"], sources)
    held = agent.preparer.gates.holders(proxy.url)
    print(f"good adapter alone: {normal:.2f} s; two good beside {DRIPPING} dripping: {beside:.2f} s; drip slots {held}")
    assert beside <= normal + 5.0
    assert held <= agent.settings.endpoint_workers
    assert all(not kube.status.get(f"drip{i}", (None,))[0] or not kube.status[f"drip{i}"][0].loaded for i in range(4))
    for i in range(DRIPPING):  # deleted: their preparations are cancelled, nothing stays behind
        desired.items.pop(f"drip{i}")
    desired.on_change()
    eventually(lambda: not agent.busy, timeout=10)
    proxy.rules.clear()
    agent.stop()
