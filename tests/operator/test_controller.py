"""Passes of the keyed queue over one server, in process: kopf's indexes are dicts, the API calls are fakes. What
many events about one server cost (one running pass and one after it), and what the pass after them reads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.operator.control import controller, lora_adapters, mappers, model_servers
from moelora.operator.control.context import Context
from moelora.operator.decide import indexes, plan
from moelora.operator.decide.indexes import AdapterEntry, ServerEntry
from moelora.operator.settings import Settings

KEY = ("ns", "srv")


def stored(name: str, *, version: int = 1, phase: str = "Pending") -> dict[str, Any]:
    """An adapter as the index keeps it."""
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(version)}, "status": {"phase": phase}}


@pytest.fixture
def memo() -> Iterator[Context]:
    memo = Context(settings=Settings(), kernel_bundle=None, api=None, executor=concurrent.futures.ThreadPoolExecutor(2))
    yield memo
    memo.executor.shutdown()


def observed(adapters: list[AdapterEntry]) -> controller.Indexes:
    return controller.Indexes(
        servers={KEY: [ServerEntry(key=KEY, uid="u1", generation=1)]},
        adapters={KEY: adapters},
        pods={},
        placement={},
    )


async def adapter_event(memo: Context, index: controller.Indexes, name: str, type: str) -> None:
    """What kopf hands the mapper for a watch event of adapter `name` of server srv."""
    body = {"metadata": {"name": name, "namespace": "ns"}, "spec": {"modelServer": "srv"}}
    await mappers.adapter_event(
        event={"type": type},
        body=body,
        namespace="ns",
        spec=body["spec"],
        memo=memo,
        model_servers_index=index.servers,
        adapters_index=index.adapters,
    )


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, str]]]:
    """(what the pass wrote: reconcile or counts, {adapter: phase} it counted); adapters' roll-ups write nothing."""
    done: list[tuple[str, dict[str, str]]] = []

    def fake(what: str) -> Any:
        def write(*, memo: Context, key: tuple[str, str], adapters: list[AdapterEntry], **_: Any) -> None:
            done.append((what, {entry.name: entry.phase for entry in adapters}))
            time.sleep(0.05)

        return write

    monkeypatch.setattr(plan, "roll_up", lambda observation: [])
    monkeypatch.setattr(model_servers, "reconcile", fake("reconcile"))
    monkeypatch.setattr(model_servers, "write_counts", fake("counts"))
    return done


async def test_a_pass_reconciles_once_then_writes_only_the_counts_that_moved(memo: Context, passes: list) -> None:
    entries = [AdapterEntry(name="a", phase="Pending", body=stored("a"))]
    index = observed(entries)
    assert await controller.process(KEY, memo=memo, observed=index) is None
    assert await controller.process(KEY, memo=memo, observed=index) is None  # nothing moved: no API call
    entries[0] = entries[0]._replace(phase="Loaded")
    await controller.process(KEY, memo=memo, observed=index)
    assert passes == [("reconcile", {"a": "Pending"}), ("counts", {"a": "Loaded"})]
    # A new spec (generation) or a resync (which forgets what was rendered) reconciles again.
    index.servers[KEY] = [ServerEntry(key=KEY, uid="u1", generation=2)]
    await controller.process(KEY, memo=memo, observed=index)
    memo.expectations.forget_rendered(KEY)
    await controller.process(KEY, memo=memo, observed=index)
    assert [what for what, _ in passes] == ["reconcile", "counts", "reconcile", "reconcile"]


async def test_phase_changes_during_a_pass_are_all_counted_by_the_pass_after(memo: Context, passes: list) -> None:
    """Two adapters fail at once; the index has seen neither write yet. The pass running when the second is written
    counts the first only; the one after it (the key was queued meanwhile) counts both."""
    entries = [AdapterEntry(name=name, phase="Pending", body=stored(name)) for name in ("a", "b")]
    memo.queue.start(lambda key: controller.process(key, memo=memo, observed=observed(entries)))
    memo.expectations.status_written(("ns", "a"), stored("a", version=2, phase="Failed"))  # as a roll-up records
    memo.queue.add(KEY)
    while not passes:
        await asyncio.sleep(0.005)
    memo.expectations.status_written(("ns", "b"), stored("b", version=3, phase="Failed"))
    memo.queue.add(KEY)
    await memo.queue.drained()
    await memo.queue.stop()
    assert passes[0] == ("reconcile", {"a": "Failed", "b": "Pending"})
    assert passes[-1] == ("counts", {"a": "Failed", "b": "Failed"}) and len(passes) == 2


async def test_a_hundred_adapter_events_cost_two_passes(memo: Context, passes: list) -> None:
    """After a restart nothing is rendered yet and every adapter event queues its server: 100 of them arriving while
    the first pass runs cost one more pass, not 100, and it reads every adapter as the index has it then."""
    names = [f"a{i}" for i in range(100)]
    entries: list[AdapterEntry] = []
    index = observed(entries)
    memo.queue.start(lambda key: controller.process(key, memo=memo, observed=index))
    for i, name in enumerate(names):
        entries.append(AdapterEntry(name=name, phase="Failed", secret=f"s{i % 3}", body=stored(name)))
        await adapter_event(memo, index, name, "ADDED")
        while not passes:  # the first pass is under way before the other 99 arrive
            await asyncio.sleep(0.001)
    await memo.queue.drained()
    await memo.queue.stop()
    assert 1 <= memo.queue.passes <= 2 and len(passes) <= 2
    assert passes[-1][1] == dict.fromkeys(names, "Failed")
    assert memo.expectations.server(KEY).rendered.secrets == frozenset({"s0", "s1", "s2"})


async def test_an_adapter_moving_away_queues_the_server_whose_grant_named_its_secret(
    memo: Context, passes: list
) -> None:
    other = ("ns", "old")
    index = observed([])
    index.servers[other] = [ServerEntry(key=other, uid="u2", generation=1)]
    index.adapters[other] = [AdapterEntry(name="a", phase="Loaded", secret="s", body=stored("a"))]
    await controller.process(other, memo=memo, observed=index)
    assert memo.expectations.server(other).rendered.secrets == frozenset({"s"})
    index.adapters[other] = []
    index.adapters[KEY] = [AdapterEntry(name="a", phase="Loaded", secret="s", body=stored("a", version=2))]
    await adapter_event(memo, index, "a", "MODIFIED")
    assert memo.queue.pending() == 2  # its new server and the old one, whose Role still grants "s"


def test_the_later_status_write_decides_whichever_finishes_last(monkeypatch: pytest.MonkeyPatch, memo: Context) -> None:
    """Two roll-ups of one adapter in flight: the one the API server stored later decides the phase a pass counts,
    even when the earlier one finishes last; once the index holds a copy at least as new as the write, the index
    decides."""
    from moelora.operator.decide import indexes
    from moelora.operator.kube import apply

    stored_as = {"Failed": 12, "Loaded": 10}  # the Failed write reached the API server after the Loaded one

    def fake_patch(*, api: Any, plural: str, namespace: str, name: str, status: dict) -> dict:
        return {"metadata": {"name": name, "resourceVersion": str(stored_as[status["phase"]])}, "status": status}

    monkeypatch.setattr(apply, "patch_status", fake_patch)
    for phase in ("Failed", "Loaded"):  # the later write's roll-up finishes first
        rollup = plan.Rollup(
            body=stored("a", version=5), patch={"phase": phase}, emission=None, inputs=0, remember=False
        )
        lora_adapters.write_rollup(memo=memo, rollup=rollup)

    def phase_with_index_at(version: int, phase: str) -> str:
        entries = [AdapterEntry(name="a", phase=phase, body=stored("a", version=version, phase=phase))]
        return indexes.adapter_phases(memo.expectations, "ns", entries)[0].phase

    assert phase_with_index_at(5, "Pending") == "Failed"
    assert phase_with_index_at(11, "Loaded") == "Failed"
    assert phase_with_index_at(13, "Ready") == "Ready"


async def test_an_unchanged_adapter_is_judged_once(memo: Context) -> None:
    """A pod event whose pods read as before, or the echo of the pass's own write, re-judges no adapter: once
    judged with nothing to write, the same inputs are not judged again; a pod turning ready re-judges them all."""
    entries = [AdapterEntry(name=f"a{i}", phase="Pending", body=stored(f"a{i}")) for i in range(3)]
    index = observed(entries)
    index.pods[KEY] = [indexes.PodEntry(name="srv-0", ready=False)]
    first = await controller.observe(memo, KEY, index)
    assert len(first.judge) == 3
    settled = [
        plan.Rollup(body=judged.body, patch={}, emission=None, inputs=judged.inputs, remember=judged.remember)
        for judged in first.judge
    ]
    await lora_adapters.write_rollups(memo=memo, key=KEY, rollups=settled)
    assert (await controller.observe(memo, KEY, index)).judge == []
    index.pods[KEY] = [indexes.PodEntry(name="srv-0", ready=True)]
    assert len((await controller.observe(memo, KEY, index)).judge) == 3


def test_a_childs_status_write_moves_its_entry_whatever_its_resource_version() -> None:
    """A pass reconciles when a watched child changes; the entry follows what it holds, so a status write that
    leaves the resourceVersion as it was (the local emulator does so for built-in kinds) still counts, and a new
    resourceVersion alone does not."""
    labels = {"moelora.io/model-server": "srv"}
    body = {
        "kind": "Deployment",
        "metadata": {"name": "srv", "namespace": "ns", "resourceVersion": "5", "labels": labels},
        "spec": {"replicas": 2},
        "status": {"readyReplicas": 1},
    }

    def entry(obj: dict) -> Any:
        return indexes.children_index(body=obj, labels=labels, name="srv", namespace="ns")

    ready = {**body, "status": {"readyReplicas": 2}}
    assert entry(ready) != entry(body)
    assert entry({**body, "metadata": {**body["metadata"], "resourceVersion": "6"}}) == entry(body)
