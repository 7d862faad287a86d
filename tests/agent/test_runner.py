"""The agent's loop without vLLM (it is down): what it decides before vLLM is involved."""

from __future__ import annotations

import json
import pathlib
import threading

import pytest

from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.agent.serve.vllm import VllmClient
from moelora.local import process

from .conftest import MemoryDesired, MemoryKube, adapter_files, agent_settings, eventually, upload


def test_a_bad_config_fails_before_the_weights_are_downloaded(
    agent: tuple[Agent, MemoryDesired, MemoryKube], s3_env: str, bucket: str
) -> None:
    loop, desired, kube = agent
    files = adapter_files(rank=64, extra_bytes=4 << 20)  # 4 MiB of weights that must never be fetched
    upload(s3_env, bucket, "big/", files)
    desired.synced.set()
    desired.put("big", {"source": {"uri": f"s3://{bucket}/big/"}})
    eventually(lambda: "big" in kube.status and kube.status["big"][0].reason == "RankTooHigh")
    # The rank it read is reported (kubectl's RANK column), though no weights were fetched to size.
    _, facts = kube.status["big"]
    assert facts is not None and (facts.rank, facts.size_bytes) == (64, None)
    assert loop.metrics.registry.get_sample_value("moelora_adapter_downloaded_bytes_total", {"adapter": "big"}) in (
        None,
        0.0,
    )
    assert not any(p for p in loop.settings.cache_dir.iterdir())


def test_good_adapter_waits_for_vllm_and_the_pod_stays_unready(
    agent: tuple[Agent, MemoryDesired, MemoryKube], s3_env: str, bucket: str
) -> None:
    loop, desired, kube = agent
    files = adapter_files()
    upload(s3_env, bucket, "ok/", files)
    desired.synced.set()
    desired.put("ok", {"source": {"uri": f"s3://{bucket}/ok/"}})
    eventually(lambda: len([p for p in loop.settings.cache_dir.iterdir() if not p.name.startswith(".")]) == 1)
    # The cache directory exists from the download's start: wait for the report that follows Downloading.
    eventually(lambda: "ok" in kube.status and kube.status["ok"][0].state.value != "Downloading")
    state, info = kube.status["ok"]
    assert (state.loaded, state.state.value) == (False, "Pending") and info is None  # downloaded, waiting for vLLM
    assert not loop.is_ready and not loop.vllm_up
    (entry,) = loop.settings.cache_dir.iterdir()
    assert json.loads((entry / "adapter_config.json").read_text())["r"] == 8


def test_a_source_outside_the_policy_gets_no_request_and_no_secret_read(
    agent: tuple[Agent, MemoryDesired, MemoryKube], s3_env: str, bucket: str
) -> None:
    import http.server

    hits: list[str] = []

    class Record(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            hits.append(self.path)
            self.send_response(500)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=elsewhere.serve_forever, daemon=True).start()
    try:
        loop, desired, kube = agent
        read: list[str] = []
        kube.read_secret = lambda *, name: read.append(name)  # type: ignore[method-assign]
        desired.synced.set()
        endpoint = f"http://127.0.0.1:{elsewhere.server_address[1]}"
        desired.put("forged", {"source": {"uri": f"s3://{bucket}/x/", "endpointUrl": endpoint}})
        desired.put(
            "also",
            {"source": {"uri": f"s3://{bucket}/y/", "endpointUrl": endpoint, "credentialsSecret": {"name": "s"}}},
        )
        for name in ("forged", "also"):
            eventually(lambda name=name: name in kube.status and kube.status[name][0].reason == "SourceNotAllowed")
        assert hits == [] and read == []
    finally:
        elsewhere.shutdown()


def test_a_stop_during_a_step_lets_the_step_finish_and_the_loop_end(
    s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    # SIGTERM's handler runs agent.stop() in the main thread, inside the step it interrupts: the step must still be
    # able to start downloads and publish statuses ("cannot schedule new futures after shutdown" before).
    settings = agent_settings(tmp_path / "cache", vllm_url=f"http://127.0.0.1:{process.free_port()}")
    kube, desired = MemoryKube(), MemoryDesired()
    vllm = VllmClient(base_url=settings.vllm_url, attempts=1)
    loop = Agent(settings=settings, kube=kube, desired=desired, vllm=vllm, metrics=Metrics())
    upload(s3_env, bucket, "a/", adapter_files())
    desired.synced.set()
    desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
    loop.stop()
    loop.step()  # the rest of the interrupted step: submits the download and the status
    assert set(loop.busy) == {"uid-a"}
    loop.run()  # returns at once: stopping is set
    with pytest.raises(RuntimeError):
        loop.pool.submit(print)  # the loop's end closed the pools


def test_a_loop_ended_by_an_exception_past_its_step_still_closes_the_pools(tmp_path: pathlib.Path) -> None:
    # A KeyboardInterrupt (or SystemExit) passes the step's `except Exception`; open pools would keep the process
    # waiting for their downloads at exit.
    settings = agent_settings(tmp_path / "cache", vllm_url=f"http://127.0.0.1:{process.free_port()}", poll_seconds=0.01)
    loop = Agent(settings=settings, kube=MemoryKube(), desired=MemoryDesired(), vllm=None, metrics=Metrics())  # type: ignore[arg-type]

    def interrupted() -> None:
        raise KeyboardInterrupt

    loop.step = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        loop.run()
    for pool in (loop.pool, loop.status_pool):
        with pytest.raises(RuntimeError):
            pool.submit(print)
