"""The adapter cache's LRU eviction, on real directories."""

import os
import pathlib

from moelora.agent.store.cache import AdapterCache


def make(root: pathlib.Path, version: str, size: int, used: float) -> None:
    (root / version).mkdir(parents=True)
    (root / version / "adapter_model.safetensors").write_bytes(b"x" * size)
    os.utime(root / version, (used, used))


def test_evicts_least_recently_used_until_it_fits(tmp_path: pathlib.Path) -> None:
    cache = AdapterCache(root=tmp_path, limit_bytes=250)
    make(tmp_path, "old", 100, used=1000)
    make(tmp_path, "mid", 100, used=2000)
    make(tmp_path, "new", 100, used=3000)
    assert cache.total_bytes() == 300
    assert cache.evict(keep=()) == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mid", "new"]


def test_touch_makes_an_entry_recent(tmp_path: pathlib.Path) -> None:
    cache = AdapterCache(root=tmp_path, limit_bytes=250)
    make(tmp_path, "old", 100, used=1000)
    make(tmp_path, "mid", 100, used=2000)
    make(tmp_path, "new", 100, used=3000)
    cache.touch("old")
    assert cache.evict(keep=()) == ["mid"]


def test_never_evicts_loaded_adapters(tmp_path: pathlib.Path) -> None:
    cache = AdapterCache(root=tmp_path, limit_bytes=150)
    make(tmp_path, "a", 100, used=1000)
    make(tmp_path, "b", 100, used=2000)
    make(tmp_path, "c", 100, used=3000)
    assert cache.evict(keep={"a", "b"}) == ["c"]  # the only one not loaded, though the newest
    assert cache.total_bytes() == 200  # still over: kept entries are never removed


def test_makes_room_for_a_download(tmp_path: pathlib.Path) -> None:
    cache = AdapterCache(root=tmp_path, limit_bytes=300)
    make(tmp_path, "a", 100, used=1000)
    make(tmp_path, "b", 100, used=2000)
    assert cache.evict(keep=()) == []
    assert cache.evict(keep=(), room_for=150) == ["a"]


def test_temporaries_are_removed_and_never_count(tmp_path: pathlib.Path) -> None:
    cache = AdapterCache(root=tmp_path, limit_bytes=1000)
    make(tmp_path, ".tmp-abc", 500, used=1000)
    make(tmp_path, "a", 100, used=1000)
    assert [e.version for e in cache.entries()] == ["a"]
    cache.remove_temporaries()
    assert [p.name for p in tmp_path.iterdir()] == ["a"]
