"""Adapters asked for by vLLM's LoRA resolver (moelora.agent.serve.ondemand) on a pod where they are not placed: the
loop (a fake vLLM, real S3, a clock the test moves) fetches and checks them as it does placed ones and hands the files
to the resolver instead of loading them itself; names that are no LoRAAdapter of the server, and adapters the checks
refuse, are refused with their reason; held ones make room for placed ones, coldest first. The listener the resolver
calls wants the pod's admin key."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import pathlib
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import safetensors.numpy

from moelora.agent.reconcile import Record, Stage
from moelora.agent.report.metrics import Metrics
from moelora.agent.runner import Agent
from moelora.agent.serve.ondemand import ADDRESS_FILE, Answer, Held, Resolutions, ResolveServer, coldest
from moelora.agent.serve.vllm import ADMIN_KEY_HEADER
from moelora.api import FailureReason

from .conftest import FakeVllm, MemoryDesired, MemoryKube, adapter_files, agent_settings, eventually, upload


@dataclasses.dataclass
class Loop:
    """An agent of a placed pod: `placed` are its assignments, `server` every LoRAAdapter of its ModelServer."""

    agent: Agent
    placed: MemoryDesired
    server: MemoryDesired
    vllm: FakeVllm
    kube: MemoryKube
    bucket: str
    clock: list[float]
    asking: concurrent.futures.ThreadPoolExecutor

    def ask(self, name: str) -> concurrent.futures.Future[Answer]:
        """A resolver's request, waiting in its own thread as vLLM's does (returned once it waits, or is answered)."""
        asked = self.asking.submit(self.agent.resolutions.ask, name, timeout=10)
        eventually(lambda: asked.done() or name in self.agent.resolutions.asked(), timeout=5)
        return asked

    def step(self) -> None:
        """One pass, the clock a poll further, then wait for the downloads it started."""
        self.agent.step()
        self.clock[0] += self.agent.settings.poll_seconds
        concurrent.futures.wait(list(self.agent.busy.values()), timeout=30)

    def answer(self, asked: concurrent.futures.Future[Answer]) -> Answer:
        for _ in range(10):
            if asked.done():
                break
            self.step()
        return asked.result(timeout=5)

    def put(self, name: str, *, placed: bool = False) -> None:
        spec = {"source": {"uri": f"s3://{self.bucket}/{name}/"}}
        self.server.put(name, spec)
        if placed:
            self.placed.put(name, spec)

    def record(self, name: str) -> Record:
        return self.agent.records[f"uid-{name}"]

    def metric(self, name: str, **labels: str) -> float | None:
        return self.agent.metrics.registry.get_sample_value(name, labels)


def nan_weights() -> dict[str, bytes]:
    files = adapter_files(seed=9)
    tensors = safetensors.numpy.load(files["adapter_model.safetensors"])
    name = next(key for key in tensors if key.endswith("lora_B.weight"))
    tensors[name] = np.full_like(tensors[name], np.nan)
    return {**files, "adapter_model.safetensors": safetensors.numpy.save(tensors)}


SIZE = sum(len(b) for b in adapter_files().values())


class PlacedVllm(FakeVllm):
    def metrics_text(self) -> str | None:  # placement samples the load: no gauge before a LoRA request
        return None


@pytest.fixture
def loop(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> Iterator[Loop]:
    for name, files in {
        "a": adapter_files(seed=1),
        "b": adapter_files(seed=2),
        "p": adapter_files(seed=3),
        "r32": adapter_files(rank=32, hidden=8),
        "nan": nan_weights(),
    }.items():
        upload(s3_env, bucket, f"{name}/", files)
    # Room for two of the good adapters, not three.
    settings = agent_settings(tmp_path / "cache", cache_bytes=int(2.5 * SIZE), poll_seconds=1.0, placement=True)
    placed, server, vllm, kube, clock = MemoryDesired(), MemoryDesired(), PlacedVllm(), MemoryKube(), [1000.0]
    agent = Agent(
        settings=settings,
        kube=kube,
        desired=placed,
        vllm=vllm,  # type: ignore[arg-type]
        metrics=Metrics(),
        monotonic=lambda: clock[0],
        catalogue=server.snapshot,
    )
    placed.synced.set()
    with concurrent.futures.ThreadPoolExecutor(4) as asking:
        yield Loop(agent, placed, server, vllm, kube, bucket, clock, asking)
        agent.stop()


def test_an_adapter_placed_elsewhere_is_checked_and_handed_to_vllms_resolver(loop: Loop) -> None:
    loop.put("a")
    answer = loop.answer(loop.ask("a"))

    record = loop.record("a")
    assert answer == Answer(200, path=record.path) and record.path is not None
    assert loop.vllm.checks == [record.path]  # the output check ran on exactly those files ...
    assert loop.vllm.calls == []  # ... and the loop left the load to vLLM, whose resolver holds the name's lock
    assert loop.ask("a").result(timeout=5) == answer  # asked again (vLLM's load failed): answered at once

    loop.vllm.served["a"] = record.path  # vLLM registers what its resolver got
    loop.step()
    assert record.stage is Stage.LOADED
    assert loop.metric("moelora_adapter_loaded", adapter="a", served_name="a") == 1
    assert loop.metric("moelora_adapter_on_demand", adapter="a") == 1
    assert loop.kube.status == {}  # no status entry: the operator keeps only the assigned pods'
    assert loop.metric("moelora_adapter_load_duration_seconds_count") == 1
    for _ in range(3):
        loop.step()
    assert loop.vllm.served == {"a": record.path} and loop.vllm.calls == []  # held: neither unloaded nor reloaded


def test_a_name_that_is_no_adapter_of_the_server_is_refused_without_a_download(loop: Loop) -> None:
    loop.put("a")
    answer = loop.answer(loop.ask("b"))  # uploaded, but no LoRAAdapter of this server names it
    assert (answer.status, answer.reason) == (404, "NotFound") and "'b'" in answer.message
    assert loop.agent.records == {} and loop.agent.busy == {}
    assert not loop.agent.settings.cache_dir.exists() or list(loop.agent.settings.cache_dir.iterdir()) == []


@pytest.mark.parametrize(
    "name, reason", [("r32", FailureReason.RANK_TOO_HIGH), ("nan", FailureReason.WEIGHTS_NON_FINITE)]
)
def test_an_adapter_the_checks_refuse_is_refused_with_its_reason(loop: Loop, name: str, reason: FailureReason) -> None:
    loop.put(name)
    answer = loop.answer(loop.ask(name))
    assert (answer.status, answer.reason) == (422, reason.value)
    assert f"{name!r} cannot be served on this pod: {reason.value}" in answer.message
    assert loop.vllm.checks == [] and loop.vllm.calls == []  # vLLM never saw the files
    again = loop.answer(loop.ask(name))  # the verdict stands: answered from the record, nothing downloaded again
    assert again == answer and loop.agent.busy == {}


def test_a_request_for_a_placed_adapter_still_on_its_way_waits_for_it(loop: Loop) -> None:
    loop.put("p", placed=True)
    asked = loop.ask("p")  # before the loop has even listed it
    answer = loop.answer(asked)
    assert answer.status == 200 and loop.vllm.calls == []  # handed over, not loaded behind the resolver's back
    loop.vllm.served["p"] = answer.path or ""
    loop.step()
    state, _ = loop.kube.status["p"]
    assert state.loaded and loop.metric("moelora_adapter_on_demand", adapter="p") is None


def test_held_adapters_make_room_for_a_placed_one_coldest_first(loop: Loop) -> None:
    for name in ("a", "b"):  # "a" asked first: the colder
        loop.put(name)
        loop.vllm.served[name] = loop.answer(loop.ask(name)).path or ""
        loop.step()
    assert {loop.record("a").stage, loop.record("b").stage} == {Stage.LOADED}

    loop.put("p", placed=True)
    for _ in range(6):
        loop.step()
    assert loop.record("p").stage is Stage.LOADED
    assert set(loop.vllm.served) == {"b", "p"} and ("unload", "a", None, False) in loop.vllm.calls
    assert "uid-a" not in loop.agent.records and loop.metric("moelora_adapter_on_demand", adapter="a") is None
    versions = {p.name for p in loop.agent.settings.cache_dir.iterdir() if not p.name.startswith(".")}
    assert versions == {loop.record("b").version, loop.record("p").version}


def test_an_adapter_placed_here_later_stops_being_held_on_demand(loop: Loop) -> None:
    loop.put("a")
    loop.vllm.served["a"] = loop.answer(loop.ask("a")).path or ""
    loop.step()
    loop.put("a", placed=True)
    loop.step()
    assert loop.metric("moelora_adapter_on_demand", adapter="a") is None
    assert loop.kube.status["a"][0].loaded and loop.vllm.calls == []  # the same files, now reported


def test_after_an_agent_restart_what_vllm_got_from_the_resolver_is_held_not_unloaded_as_foreign(loop: Loop) -> None:
    loop.put("a")
    loop.vllm.served["a"] = loop.answer(loop.ask("a")).path or ""
    loop.step()
    loop.agent.stop()
    again = Agent(  # the agent's container restarted: vLLM, the cache volume and the LoRAAdapters are the same
        settings=loop.agent.settings,
        kube=loop.kube,
        desired=loop.placed,
        vllm=loop.vllm,  # type: ignore[arg-type]
        metrics=Metrics(),
        monotonic=lambda: loop.clock[0],
        catalogue=loop.server.snapshot,
    )
    loop.agent = again
    for _ in range(3):
        loop.step()
    assert loop.record("a").stage is Stage.LOADED and loop.vllm.served == {"a": loop.record("a").path}
    assert loop.vllm.calls == [] and loop.kube.events == []  # neither unloaded nor reported as foreign
    assert loop.metric("moelora_adapter_on_demand", adapter="a") == 1


def test_an_adapter_being_unloaded_is_not_answered_at_once_to_the_resolver(loop: Loop) -> None:
    """A deleted adapter's name asked for while the loop unloads it waits for the loop, which refuses it: the
    answer left from the last pass must not let vLLM load it back (seen in a fresh-clone CI, 2026-12-07)."""
    loop.put("a", placed=True)
    for _ in range(3):
        loop.step()
    assert loop.record("a").stage is Stage.LOADED
    asked_during: list[Answer] = []
    unload = loop.vllm.unload

    def unload_and_ask(*, name: str) -> bool:
        asked_during.append(loop.agent.resolutions.ask(name, timeout=0.01))  # vLLM's resolver, mid-unload
        return unload(name=name)

    loop.vllm.unload = unload_and_ask  # type: ignore[method-assign]
    loop.placed.delete("a")
    loop.server.delete("a")
    loop.step()
    assert [a.status for a in asked_during] == [503] and "a" not in loop.vllm.served
    answer = loop.answer(loop.ask("a"))
    assert answer.status == 404, answer  # then refused: no LoRAAdapter of this server


def test_files_from_the_agents_cache_under_a_deleted_name_are_unloaded_without_a_foreign_event(loop: Loop) -> None:
    """What vLLM's resolver got just before the LoRAAdapter went is unloaded quietly; files from anywhere else, or
    a path that climbs out of the cache, are a finding."""
    loop.put("a")
    path = loop.answer(loop.ask("a")).path or ""
    assert path.startswith(str(loop.agent.settings.cache_dir))
    loop.server.delete("a")
    loop.step()  # its record goes: nothing explains the name any more
    loop.vllm.served.update({"a": path, "x": "/elsewhere/x", "y": f"{loop.agent.settings.cache_dir}/../y"})
    loop.step()
    assert loop.vllm.served == {}
    assert loop.metric("moelora_foreign_adapters_total", action="unloaded") == 2  # counted as they are found
    eventually(lambda: len(loop.kube.events) == 2, timeout=5)  # the Events are written on the reporter's pool
    assert sorted(e["message"].split("'")[1] for e in loop.kube.events) == ["x", "y"]
    assert all(e["reason"] == "ForeignAdapterUnloaded" for e in loop.kube.events)


# ---- pure parts ----


def test_the_coldest_go_first_and_none_when_all_would_not_do() -> None:
    held = [
        Held("busy", load=0.8, since=1.0, size=10),
        Held("old", load=0.0, since=1.0, size=10),
        Held("new", load=0.0, since=5.0, size=10),
    ]
    assert coldest(held, 5) == ["old"]
    assert coldest(held, 15) == ["old", "new"]
    assert coldest(held, 30) == ["old", "new", "busy"]
    assert coldest(held, 31) == []
    assert coldest(held, 0) == []


def test_a_wait_that_outlasts_its_time_is_a_503() -> None:
    woken = []
    desk = Resolutions(wake=lambda: woken.append(1))
    answer = desk.ask("slow", timeout=0.05)
    assert (answer.status, answer.reason) == (503, "Preparing") and woken == [1]
    assert desk.asked() == []  # the request that gave up waits no longer


# ---- the listener vLLM's resolver calls ----


@pytest.fixture
def listener(tmp_path: pathlib.Path) -> Iterator[tuple[ResolveServer, Resolutions]]:
    desk = Resolutions(wake=lambda: None)
    server = ResolveServer(resolutions=desk, key="k3y", timeout=0.2, address_file=tmp_path / "admin" / ADDRESS_FILE)
    server.start()
    yield server, desk
    server.stop()


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_listener_wants_the_admin_key_and_a_name(listener: tuple[ResolveServer, Resolutions]) -> None:
    server, desk = listener
    desk.serve("a", "/cache/v1")
    address = server.address_file.read_text()
    assert address == server.url and address.startswith("http://127.0.0.1:")
    assert stat.S_IMODE(server.address_file.stat().st_mode) == 0o600
    name = json.dumps({"name": "a"}).encode()
    assert post(address + "/resolve", name, {})[0] == 403
    assert post(address + "/resolve", name, {ADMIN_KEY_HEADER: "k3y-not"})[0] == 403
    assert post(address + "/other", name, {ADMIN_KEY_HEADER: "k3y"})[0] == 404
    assert post(address + "/resolve", b'{"model": "a"}', {ADMIN_KEY_HEADER: "k3y"})[0] == 400
    assert post(address + "/resolve", name, {ADMIN_KEY_HEADER: "k3y"}) == (200, {"path": "/cache/v1"})
    status, body = post(address + "/resolve", json.dumps({"name": "b"}).encode(), {ADMIN_KEY_HEADER: "k3y"})
    assert status == 503 and body["reason"] == "Preparing"  # no loop answers here: the wait runs out


def test_a_stopped_listener_takes_its_address_back_and_leaves_a_newer_one(tmp_path: pathlib.Path) -> None:
    address = tmp_path / "admin" / ADDRESS_FILE
    first = ResolveServer(resolutions=Resolutions(wake=lambda: None), key="k", timeout=0.2, address_file=address)
    first.start()
    assert address.read_text() == first.url
    first.stop()
    assert not address.exists()  # vLLM's resolver then finds no agent: its own 404, not a 503 from a dead address
    old = ResolveServer(resolutions=Resolutions(wake=lambda: None), key="k", timeout=0.2, address_file=address)
    new = ResolveServer(resolutions=Resolutions(wake=lambda: None), key="k", timeout=0.2, address_file=address)
    old.start()
    new.start()
    old.stop()  # a restarted agent's listener wrote after it
    assert address.read_text() == new.url
    new.stop()
