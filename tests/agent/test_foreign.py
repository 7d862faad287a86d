"""Adapters the agent did not load (no vLLM: a fake one), the agent's admin key, and the keys it sends to vLLM."""

from __future__ import annotations

import http.server
import json
import pathlib
import stat
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.agent.errors import TransientError
from moelora.agent.reconcile import Record, Stage
from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.agent.serve import admin_key, foreign
from moelora.agent.serve.vllm import ADMIN_KEY_HEADER, VllmClient, classify_load_error
from moelora.agent.settings import from_env
from moelora.api.agent_env import ADMIN_KEY_FILE

from .conftest import BASE_MODEL, POD, FakeVllm, MemoryDesired, MemoryKube, agent_settings, eventually


@pytest.fixture
def loop(tmp_path: pathlib.Path) -> Iterator[tuple[Agent, FakeVllm, MemoryDesired, MemoryKube]]:
    settings = agent_settings(tmp_path / "cache", pod_uid="uid-pod")
    kube, desired, vllm = MemoryKube(), MemoryDesired(), FakeVllm()
    agent = Agent(settings=settings, kube=kube, desired=desired, vllm=vllm, metrics=Metrics())  # type: ignore[arg-type]
    desired.synced.set()
    yield agent, vllm, desired, kube
    agent.stop()


def _count(agent: Agent, action: str) -> float:
    return agent.metrics.registry.get_sample_value("moelora_foreign_adapters_total", {"action": action}) or 0.0


def test_an_adapter_the_agent_did_not_load_is_unloaded_counted_and_reported(
    loop: tuple[Agent, FakeVllm, MemoryDesired, MemoryKube], caplog: pytest.LogCaptureFixture
) -> None:
    agent, vllm, _, kube = loop
    hostile = "intruder\n[ERROR] forged log line " + "x" * 500
    vllm.served = {hostile: "/tmp/anywhere"}
    agent.step()
    assert vllm.served == {} and ("unload", hostile, None, False) in vllm.calls
    assert _count(agent, "unloaded") == 1
    (event,) = eventually(lambda: list(kube.events))
    assert event["reason"] == "ForeignAdapterUnloaded" and event["type"] == "Warning"
    assert "'intruder\\n[ERROR] forged log line xxx" in event["message"] and "\n" not in event["message"]
    assert len(event["message"]) < 300  # capped: the name cannot flood the Event or the log
    lines = [r.getMessage() for r in caplog.records if r.name == "moelora.agent.serve.foreign"]
    assert lines and all("\n" not in line and "x" * 100 not in line for line in lines)
    agent.step()  # gone: nothing more to report
    assert _count(agent, "unloaded") == 1


def test_the_agents_own_adapters_are_left_alone(loop: tuple[Agent, FakeVllm, MemoryDesired, MemoryKube]) -> None:
    agent, vllm, desired, kube = loop
    desired.put("alpha", {"source": {"uri": "s3://bkt/alpha/"}})
    (item,) = desired.snapshot()
    own = str(agent.settings.cache_dir / "v1")
    agent.records[item.uid] = Record(
        uid=item.uid, name="alpha", served_name="alpha", spec_hash=item.spec_hash, stage=Stage.LOADED, path=own
    )
    vllm.served = {"alpha": own}
    agent.step()
    assert vllm.calls == [] and _count(agent, "unloaded") == 0 and kube.events == []


def test_an_adapter_replaced_in_place_is_put_back_from_the_agents_files(
    loop: tuple[Agent, FakeVllm, MemoryDesired, MemoryKube],
) -> None:
    agent, vllm, desired, kube = loop
    desired.put("beta", {"source": {"uri": "s3://bkt/beta/"}})
    (item,) = desired.snapshot()
    own = str(agent.settings.cache_dir / "v1")
    agent.records[item.uid] = Record(
        uid=item.uid, name="beta", served_name="beta", spec_hash=item.spec_hash, stage=Stage.LOADED, path=own
    )
    vllm.served = {"beta": "/var/lib/moelora/adapters/someone-elses"}
    agent.step()
    assert vllm.served == {"beta": own} and vllm.calls == [("load", "beta", own, True)]
    assert agent.records[item.uid].stage is Stage.LOADED
    assert _count(agent, "replaced") == 1
    (event,) = eventually(lambda: list(kube.events))
    assert event["reason"] == "ForeignAdapterReplaced" and "someone-elses" in event["message"]


def test_escape_quotes_and_caps() -> None:
    assert foreign.escape("a\nb") == "'a\\nb'"
    assert foreign.escape("é" * 100).endswith("'...") and len(foreign.escape("é" * 100)) == 85


# ---- the key and the headers ----


def test_admin_key_is_random_private_and_replaced_atomically(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "admin" / "key"
    first = admin_key.create(path)
    assert path.read_text() == first and len(first) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = admin_key.create(path)
    assert second != first and path.read_text() == second
    assert sorted(p.name for p in path.parent.iterdir()) == ["key"]  # no temporaries left behind


def test_settings_read_the_key_file_and_the_api_key() -> None:
    env = {
        "MOELORA_NAMESPACE": "ns",
        "MOELORA_POD_NAME": POD,
        "MOELORA_POD_UID": "u-1",
        "MOELORA_MODEL_SERVER": "srv",
        "MOELORA_BASE_MODEL": BASE_MODEL,
        "MOELORA_MAX_LORA_RANK": "16",
        "MOELORA_ADMIN_KEY_FILE": "/run/k/key",
        "MOELORA_VLLM_API_KEY": "client-s3cret",
    }
    settings = from_env(env)
    assert settings.admin_key_file == pathlib.Path("/run/k/key") and settings.vllm_api_key == "client-s3cret"
    assert settings.pod_uid == "u-1"
    assert "client-s3cret" not in repr(settings)
    defaults = from_env({k: v for k, v in env.items() if k not in ("MOELORA_ADMIN_KEY_FILE", "MOELORA_VLLM_API_KEY")})
    assert defaults.admin_key_file == pathlib.Path(ADMIN_KEY_FILE) and defaults.vllm_api_key is None


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(dict(self.headers.items()))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            body = json.dumps({"data": []}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_every_call_carries_the_admin_key_and_the_bearer(recorder: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = recorder
    client = VllmClient(base_url=url, admin_key="pod-key", api_key="client-key")
    client.adapters()
    client.load(name="a", path="/p")
    client.unload(name="a")
    client.healthy()
    assert len(seen) == 4
    for headers in seen:
        assert headers[ADMIN_KEY_HEADER] == "pod-key" and headers["Authorization"] == "Bearer client-key"
    VllmClient(base_url=url).adapters()
    assert ADMIN_KEY_HEADER not in seen[-1] and "Authorization" not in seen[-1]


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_agent_is_a_transient_problem_not_the_adapters(status: int) -> None:
    assert isinstance(classify_load_error(status, "Unauthorized"), TransientError)


def test_header_is_the_guards() -> None:
    from moelora.vllm_plugin import admin_guard

    assert ADMIN_KEY_HEADER.lower() == admin_guard.HEADER
    assert ADMIN_KEY_FILE == admin_guard.DEFAULT_KEY_FILE
