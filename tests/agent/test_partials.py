"""Partial downloads kept for resuming belong to an adapter: the agent drops those of adapters no longer desired
(deleted while it was down, found by the chaos run of tests/chaos/test_agent_kills.py), and keeps the others."""

from __future__ import annotations

import json
import pathlib

import pytest

from moelora.agent.reconcile import Stage
from moelora.agent.runner import Agent
from moelora.agent.store import transfer
from moelora.agent.store.cache import AdapterCache
from moelora.agent.store.transfer import MANIFEST

from .conftest import MemoryDesired, MemoryKube, eventually, upload
from .test_resilience import KillAfter, big_files, item, preparer

MiB = 1 << 20


def partial(root: pathlib.Path, version: str, owner: str | None) -> pathlib.Path:
    path = root / f".part-{version}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 1000)
    if owner is not None:
        (path / MANIFEST).write_text(json.dumps({"owner": owner, "files": {}}))
    return path


def test_prune_drops_partials_of_other_owners_and_of_none_but_not_busy_ones(tmp_path: pathlib.Path) -> None:
    cache = AdapterCache(root=tmp_path, limit_bytes=1 << 30)
    wanted = partial(tmp_path, "v1", "uid-a")
    gone = partial(tmp_path, "v2", "uid-b")
    unnamed = partial(tmp_path, "v3", None)
    busy = partial(tmp_path, "v4", "uid-c")
    (tmp_path / "v5").mkdir()  # a complete entry is never a partial
    assert sorted(cache.prune_partials(owners={"uid-a"}, busy={"v4"})) == ["v2", "v3"]
    assert wanted.exists() and busy.exists() and (tmp_path / "v5").exists()
    assert not gone.exists() and not unnamed.exists()


def test_a_download_names_its_adapter_before_the_first_byte(bucket: str, s3_env: str, tmp_path: pathlib.Path) -> None:
    upload(s3_env, bucket, "k/", big_files(3))
    prep = preparer(tmp_path)
    prep.metrics.downloaded = KillAfter(0)  # type: ignore[assignment]  # killed at the first chunk
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(item("k", f"s3://{bucket}/k/"), None)
    (found,) = [p for p in tmp_path.iterdir() if p.name.startswith(".part-")]
    assert json.loads((found / MANIFEST).read_text())["owner"] == "uid-k"
    assert prep.prune_partials({"uid-k"}) == [] and found.exists()
    assert prep.prune_partials({"uid-other"}) == [found.name.removeprefix(".part-")] and not found.exists()


def test_a_restarted_agent_drops_the_partial_of_an_adapter_deleted_while_it_was_down(
    agent: tuple[Agent, MemoryDesired, MemoryKube], bucket: str, s3_env: str
) -> None:
    running, desired, kube = agent
    cache = running.settings.cache_dir
    for name, seed in (("gone", 1), ("kept", 2)):  # both killed mid-download by an earlier agent on this volume
        upload(s3_env, bucket, f"{name}/", big_files(3, seed=seed))
        earlier = preparer(cache)
        earlier.metrics.downloaded = KillAfter(1 * MiB)  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            earlier.prepare(item(name, f"s3://{bucket}/{name}/"), None)
    owners = {transfer.owner(p): p for p in cache.glob(".part-*")}
    assert set(owners) == {"uid-gone", "uid-kept"}

    desired.put("kept", {"source": {"uri": f"s3://{bucket}/kept/"}})  # "gone" was deleted meanwhile
    desired.synced.set()
    running.wake.set()
    eventually(lambda: (r := running.records.get("uid-kept")) is not None and r.stage is Stage.READY, timeout=30)
    assert not list(cache.glob(".part-*"))  # kept's completed, gone's removed
    assert not owners["uid-gone"].exists()
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [running.records["uid-kept"].version]
