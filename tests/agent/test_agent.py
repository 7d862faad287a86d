"""The agent's loop end to end with real parts: moto S3, a real vLLM, the status server; Kubernetes through the
agent's two narrow interfaces (the desired adapters in, status patches out), kept in memory here."""

from __future__ import annotations

import hashlib
import logging
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.agent.report.metrics import Metrics, StatusServer
from moelora.agent.runner import Agent
from moelora.agent.serve.vllm import VllmClient
from moelora.agent.settings import Settings
from moelora.api import ReplicaAdapterState
from moelora.local import process as local_process
from moelora.local import vllm_server as local_vllm

from .conftest import POD, VLLM_BASE_NAME, VLLM_MAX_RANK, MemoryDesired, MemoryKube, eventually, get, s3_client

pytestmark = pytest.mark.slow
SECRET_VALUE = "wJalrXUtnFEMI-very-secret-value"


# Nothing listens here: an adapter source that keeps failing as a transient error.
DEAD_ENDPOINT = f"http://127.0.0.1:{local_process.free_port()}"


class Running:
    def __init__(self, agent: Agent, desired: MemoryDesired, kube: MemoryKube, server: StatusServer) -> None:
        self.agent, self.desired, self.kube, self.server = agent, desired, kube, server
        self.url = f"http://127.0.0.1:{server.port}"

    def state(self, name: str) -> ReplicaAdapterState | None:
        with self.kube.lock:
            found = self.kube.status.get(name)
        return found[0] if found else None


@pytest.fixture
def resync_seconds() -> float:
    return 3600.0


@pytest.fixture
def cache_bytes() -> int:
    return 1 << 30


@pytest.fixture
def running(
    s3_env: str, clean_vllm: str, tmp_path: pathlib.Path, resync_seconds: float, cache_bytes: int
) -> Iterator[Running]:
    settings = Settings(
        namespace="ns",
        pod_name=POD,
        model_server="srv",
        base_model=VLLM_BASE_NAME,
        max_lora_rank=VLLM_MAX_RANK,
        target_modules=frozenset(),
        vllm_url=clean_vllm,
        cache_dir=tmp_path / "cache",
        cache_bytes=cache_bytes,
        port=0,
        poll_seconds=0.3,
        resync_seconds=resync_seconds,
        allowed_s3_endpoints=(DEAD_ENDPOINT,),
    )
    kube, desired, metrics = MemoryKube(), MemoryDesired(), Metrics()
    kube.secrets["dead-s3"] = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}
    agent = Agent(settings=settings, kube=kube, desired=desired, vllm=VllmClient(base_url=clean_vllm), metrics=metrics)
    desired.on_change = agent.wake.set
    server = StatusServer(port=0, host="127.0.0.1", metrics=metrics, ready=lambda: agent.is_ready, alive=agent.alive)
    server.start()
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    yield Running(agent, desired, kube, server)
    agent.stop()
    thread.join(timeout=10)
    server.stop()


def upload_dir(
    endpoint: str, bucket: str, prefix: str, source: pathlib.Path, extra: dict[str, bytes] | None = None
) -> None:
    client = s3_client(endpoint)
    for path in source.iterdir():
        client.put_object(Bucket=bucket, Key=prefix + path.name, Body=path.read_bytes())
    for name, data in (extra or {}).items():
        client.put_object(Bucket=bucket, Key=prefix + name, Body=data)


def test_serves_good_adapters_fails_bad_ones_alone_and_follows_changes(
    running: Running, s3_env: str, bucket: str, tiny: dict[str, Any], vllm_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    upload_dir(s3_env, bucket, "good/", tiny["v1"])
    upload_dir(s3_env, bucket, "rank32/", tiny["r32"])
    upload_dir(s3_env, bucket, "pickle/", tiny["v1"], extra={"adapter_model.bin": b"\x80\x04."})
    upload_dir(s3_env, bucket, "v2/", tiny["v2"])
    vllm = VllmClient(base_url=vllm_url)
    assert get(running.url + "/readyz")[0] == 503  # nothing synced yet

    running.desired.synced.set()
    running.desired.put("good", {"source": {"uri": f"s3://{bucket}/good/"}})
    running.desired.put("rank32", {"source": {"uri": f"s3://{bucket}/rank32/"}})
    running.desired.put("pickle", {"source": {"uri": f"s3://{bucket}/pickle/"}})
    running.kube.secrets["s3-creds"] = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET_VALUE}
    running.desired.put(
        "with-secret",
        {"source": {"uri": f"s3://{bucket}/v2/", "credentialsSecret": {"name": "s3-creds"}}, "servedName": "team/v2"},
    )
    running.desired.put("no-secret", {"source": {"uri": f"s3://{bucket}/v2/", "credentialsSecret": {"name": "absent"}}})

    eventually(lambda: get(running.url + "/readyz")[0] == 200)
    states = {name: running.state(name) for name in ("good", "rank32", "pickle", "with-secret", "no-secret")}
    assert states["good"].loaded and states["good"].state.value == "Loaded" and states["good"].version
    assert states["with-secret"].loaded
    assert (states["rank32"].state.value, states["rank32"].reason) == ("Failed", "RankTooHigh")
    assert (states["pickle"].state.value, states["pickle"].reason) == ("Failed", "UnsafeWeightsFormat")
    assert (states["no-secret"].state.value, states["no-secret"].reason) == ("Failed", "SecretNotFound")
    info = running.kube.status["good"][1]
    assert info is not None and info.rank == 8 and info.base_model == VLLM_BASE_NAME
    assert set(info.target_modules) == {"q_proj", "v_proj"}
    loaded = vllm.adapters()
    assert set(loaded) == {"good", "team/v2"}
    assert pathlib.Path(loaded["good"].path).parent == running.agent.settings.cache_dir
    v1_answer = local_vllm.complete(url=vllm_url, model="good", prompt="hello world", max_tokens=8).token_ids
    v2_answer = local_vllm.complete(url=vllm_url, model="team/v2", prompt="hello world", max_tokens=8).token_ids
    assert v1_answer != v2_answer

    # vLLM forgets an adapter (as after a restart): the agent registers it again.
    vllm.unload(name="good")
    eventually(lambda: "good" in vllm.adapters())

    # A new version (here: another source, pinned by sha256) is loaded in place under the same name.
    sha = hashlib.sha256((tiny["v2"] / "adapter_model.safetensors").read_bytes()).hexdigest()
    old_path = loaded["good"].path
    running.desired.put("good", {"source": {"uri": f"s3://{bucket}/v2/"}, "pin": {"sha256": sha}})
    eventually(lambda: vllm.adapters()["good"].path != old_path and running.state("good").loaded)
    assert local_vllm.complete(url=vllm_url, model="good", prompt="hello world", max_tokens=8).token_ids == v2_answer

    # Deleted: unloaded, and its metrics gone.
    running.desired.delete("good")
    eventually(lambda: "good" not in vllm.adapters())
    status, metrics = get(running.url + "/metrics")
    assert status == 200 and 'adapter="good"' not in metrics
    assert 'moelora_adapter_loaded{adapter="with-secret",served_name="team/v2"} 1.0' in metrics
    assert 'moelora_adapter_failures_total{adapter="rank32",reason="RankTooHigh"} 1.0' in metrics
    assert 'moelora_adapter_downloaded_bytes_total{adapter="with-secret"}' in metrics
    assert get(running.url + "/healthz")[0] == 200

    # The Secret's value never left the agent: not in logs, statuses or metrics.
    published = repr(running.kube.status) + metrics + caplog.text
    assert SECRET_VALUE not in published


def test_pin_mismatch_and_name_conflict(
    running: Running, s3_env: str, bucket: str, tiny: dict[str, Any], vllm_url: str
) -> None:
    upload_dir(s3_env, bucket, "a/", tiny["v1"])
    upload_dir(s3_env, bucket, "b/", tiny["v2"])
    running.desired.synced.set()
    running.desired.put("pinned", {"source": {"uri": f"s3://{bucket}/a/"}, "pin": {"etag": "0123abcd"}})
    running.desired.put(
        "older", {"source": {"uri": f"s3://{bucket}/a/"}, "servedName": "shared"}, created="2026-01-01T00:00:00Z"
    )
    running.desired.put(
        "newer", {"source": {"uri": f"s3://{bucket}/b/"}, "servedName": "shared"}, created="2026-01-02T00:00:00Z"
    )
    eventually(lambda: get(running.url + "/readyz")[0] == 200)
    assert running.state("pinned").reason == "VersionMismatch"
    assert (running.state("newer").reason, running.state("older").loaded) == ("NameConflict", True)
    assert set(VllmClient(base_url=vllm_url).adapters()) == {"shared"}
    # The winner goes: the other takes the name over.
    running.desired.delete("older")
    eventually(lambda: running.state("newer").loaded)
    assert VllmClient(base_url=vllm_url).adapters()["shared"].path.endswith(running.state("newer").version)


@pytest.mark.parametrize("resync_seconds", [1.0])
def test_resync_follows_s3_without_spec_changes(
    running: Running, s3_env: str, bucket: str, tiny: dict[str, Any], vllm_url: str
) -> None:
    """New files under a loaded adapter's prefix are loaded in place; a failed adapter whose files are fixed is
    served; files already judged bad are not downloaded again."""
    upload_dir(s3_env, bucket, "live/", tiny["v1"])
    upload_dir(s3_env, bucket, "broken/", tiny["v1"], extra={"adapter_config.json": b"{not json"})
    running.desired.synced.set()
    running.desired.put("live", {"source": {"uri": f"s3://{bucket}/live/"}})
    running.desired.put("broken", {"source": {"uri": f"s3://{bucket}/broken/"}})
    eventually(lambda: get(running.url + "/readyz")[0] == 200)
    assert running.state("broken").reason == "ConfigInvalid"
    vllm = VllmClient(base_url=vllm_url)
    first_path = vllm.adapters()["live"].path

    def downloaded(name: str) -> float:
        return (
            running.agent.metrics.registry.get_sample_value("moelora_adapter_downloaded_bytes_total", {"adapter": name})
            or 0.0
        )

    broken_bytes = downloaded("broken")
    time.sleep(2.5)  # two resyncs: the bad files are listed again, not downloaded again
    assert downloaded("broken") == broken_bytes and running.state("broken").reason == "ConfigInvalid"
    upload_dir(s3_env, bucket, "live/", tiny["v2"])
    eventually(lambda: vllm.adapters()["live"].path != first_path)
    assert running.state("live").loaded
    upload_dir(s3_env, bucket, "broken/", tiny["v1"])  # fixed in place
    eventually(lambda: running.state("broken").loaded)
    assert set(vllm.adapters()) == {"live", "broken"}


def test_readiness_gates_startup_only(running: Running, s3_env: str, bucket: str, tiny: dict[str, Any]) -> None:
    """Not ready while an adapter is still retrying at startup (within MOELORA_READY_WAIT_SECONDS); once ready, a
    new slow adapter keeps it ready."""
    # An allowed endpoint of its own, with its own credentials (the policy's terms), where nothing listens.
    dead = {"uri": f"s3://{bucket}/a/", "endpointUrl": DEAD_ENDPOINT, "credentialsSecret": {"name": "dead-s3"}}
    upload_dir(s3_env, bucket, "a/", tiny["v1"])
    running.desired.synced.set()
    running.desired.put("slow", {"source": dead})
    time.sleep(2.0)
    state = running.state("slow")
    assert get(running.url + "/readyz")[0] == 503 and state.state.value in ("Downloading", "Pending")
    assert state.reason in (None, "EndpointUnreachable")
    running.desired.delete("slow")
    running.desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
    eventually(lambda: get(running.url + "/readyz")[0] == 200)
    running.desired.put("slow", {"source": dead})
    time.sleep(1.5)
    assert get(running.url + "/readyz")[0] == 200 and not running.state("slow").loaded


@pytest.mark.parametrize("cache_bytes", [170_000])  # room for two of the ~68 KB adapters, not three
def test_cache_evicts_what_is_no_longer_loaded(
    running: Running, s3_env: str, bucket: str, tiny: dict[str, Any], vllm_url: str
) -> None:
    size = sum(p.stat().st_size for p in tiny["v1"].iterdir())
    assert 2 * size < 170_000 < 3 * size
    for name, source in (("a", "v1"), ("b", "v2"), ("c", "v1")):
        upload_dir(s3_env, bucket, f"{name}/", tiny[source], extra={"variant.txt": name.encode()})
    cache = running.agent.settings.cache_dir
    running.desired.synced.set()
    running.desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
    running.desired.put("b", {"source": {"uri": f"s3://{bucket}/b/"}})
    eventually(lambda: running.state("a") and running.state("a").loaded and running.state("b").loaded)
    a_version = running.state("a").version

    # Full, and both loaded (loaded files are never evicted): a third adapter cannot reserve its bytes and waits,
    # CacheFull, instead of taking the cache over its limit ...
    running.desired.put("c", {"source": {"uri": f"s3://{bucket}/c/"}})
    eventually(lambda: running.state("c") and running.state("c").reason == "CacheFull")
    assert not running.state("c").loaded and len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2
    # ... and once "a" is gone, its retry makes room by evicting a's files, and only those.
    running.desired.delete("a")
    eventually(lambda: "a" not in VllmClient(base_url=vllm_url).adapters())
    eventually(lambda: running.state("c").loaded)
    remaining = {p.name for p in cache.iterdir() if not p.name.startswith(".")}
    assert a_version not in remaining and len(remaining) == 2
    assert set(VllmClient(base_url=vllm_url).adapters()) == {"b", "c"}
    assert local_vllm.complete(url=vllm_url, model="b", prompt="hello", max_tokens=4).token_ids  # b's files still there
