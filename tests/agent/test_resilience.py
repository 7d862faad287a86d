"""One adapter's S3 trouble stays its own: deadlines, the rate floor, retries, the endpoint cap, cache reservations,
cancellation and resumption, against moto behind a fault-injecting proxy (moelora.local.faults)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig

from moelora.agent.check.validate import Limits
from moelora.agent.errors import TransientError
from moelora.agent.prepare import Preparer
from moelora.agent.reconcile import Desired
from moelora.agent.report.metrics import Metrics
from moelora.agent.settings import Settings
from moelora.agent.store.cache import AdapterCache
from moelora.agent.store.fetch import partial_dir
from moelora.agent.store.guard import Cancelled, Deferred
from moelora.agent.store.transfer import MANIFEST
from moelora.api import FailureReason
from moelora.local.faults import Drip, FaultProxy, Hang, Reset, Rule, Status, Truncate

from .conftest import BASE_MODEL, KEYS, MemoryKube, adapter_files, agent_settings, upload

MiB = 1 << 20
SMALL_PARTS = TransferConfig(multipart_threshold=MiB, multipart_chunksize=MiB, max_concurrency=2, io_chunksize=64 << 10)


def big_files(mib: float, *, seed: int = 0) -> dict[str, bytes]:
    """A valid adapter whose weights are about `mib` MiB (two modules, rank 8, float32)."""
    return adapter_files(seed=seed, hidden=int(mib * MiB) // 128)


def settings(cache: pathlib.Path, **changes: Any) -> Settings:
    """Small limits, so the faults' deadlines are hit within a test. The listing deadline and the rate window are long
    enough that a loaded CI machine's pauses do not trip them; the tests of each narrow it."""
    small = {
        "list_timeout_seconds": 10.0,
        "download_timeout_seconds": 20.0,
        "min_bytes_per_second": 4096,
        "rate_window_seconds": 5.0,
        "s3_read_timeout_seconds": 2.0,
    }
    return agent_settings(cache, **(small | changes))


def preparer(cache: pathlib.Path, proxy: FaultProxy | None = None, **changes: Any) -> Preparer:
    extra = {"allowed_s3_endpoints": (proxy.url,)} if proxy else {}
    s = settings(cache, **extra, **changes)
    kube = MemoryKube()
    kube.secrets["tenant"] = dict(KEYS)
    limits = Limits(base_model=BASE_MODEL, max_rank=16, target_modules=frozenset(), max_bytes=s.max_adapter_bytes)
    made = Preparer(
        settings=s,
        limits=limits,
        cache=AdapterCache(root=cache, limit_bytes=s.cache_bytes),
        kube=kube,
        metrics=Metrics(),
    )
    made.transfer_config = SMALL_PARTS
    return made


def item(name: str, uri: str, proxy: FaultProxy | None = None) -> Desired:
    source: dict[str, Any] = {"uri": uri}
    if proxy is not None:
        source |= {"endpointUrl": proxy.url, "credentialsSecret": {"name": "tenant"}}
    return Desired.from_object(
        {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {"modelServer": "srv", "source": source}}
    )


@pytest.fixture
def proxy(s3_env: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_env) as running:
        yield running


def on_disk(root: pathlib.Path) -> int:
    """Bytes of the files under `root`; a walk that meets a directory renamed or removed under it is taken again."""
    while True:
        try:
            return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0
        except FileNotFoundError:
            continue


def test_a_hanging_listing_gives_up_at_its_deadline(
    proxy: FaultProxy, bucket: str, s3_env: str, tmp_path: pathlib.Path
) -> None:
    upload(s3_env, bucket, "a/", adapter_files())
    proxy.rules.append(Rule(match="list-type=2", fault=Hang(seconds=5)))
    prep = preparer(tmp_path, proxy, list_timeout_seconds=1.0)
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        prep.prepare(item("a", f"s3://{bucket}/a/", proxy), None)
    assert time.monotonic() - started < 2.5
    assert caught.value.reason is FailureReason.ENDPOINT_UNREACHABLE and "deadline" in caught.value.message
    assert prep.gates.holders(proxy.url) == 1  # the listing still blocked in its socket keeps its slot
    proxy.rules.clear()


def test_a_dripping_download_is_aborted_below_the_rate_floor_and_resumes(
    proxy: FaultProxy, bucket: str, s3_env: str, tmp_path: pathlib.Path
) -> None:
    files = big_files(3)
    upload(s3_env, bucket, "d/", files)
    proxy.rules.append(Rule(match="d/adapter_model", fault=Drip(bytes_per_step=256, step_seconds=0.1)))
    prep = preparer(tmp_path, proxy, rate_window_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        prep.prepare(item("d", f"s3://{bucket}/d/", proxy), None)
    assert time.monotonic() - started < 3 and "below the floor" in caught.value.message
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".part-")]  # kept for the next attempt
    proxy.rules.clear()
    prepared = prep.prepare(item("d", f"s3://{bucket}/d/", proxy), None)
    assert (prepared.path / "adapter_model.safetensors").read_bytes() == files["adapter_model.safetensors"]


@pytest.mark.parametrize("fault", [Reset(after_bytes=1000), Truncate(after_bytes=1000), Status(503)])
def test_resets_truncations_and_5xx_are_retried(
    fault: Any, proxy: FaultProxy, bucket: str, s3_env: str, tmp_path: pathlib.Path
) -> None:
    files = big_files(2)
    upload(s3_env, bucket, "r/", files)
    proxy.rules.append(Rule(match="r/adapter_model", fault=fault, times=2))
    prepared = preparer(tmp_path, proxy).prepare(item("r", f"s3://{bucket}/r/", proxy), None)
    assert (prepared.path / "adapter_model.safetensors").read_bytes() == files["adapter_model.safetensors"]
    assert proxy.rules[0].times == 0  # both faults were met


def test_one_endpoint_takes_at_most_its_share_of_workers(
    proxy: FaultProxy, bucket: str, s3_env: str, tmp_path: pathlib.Path
) -> None:
    upload(s3_env, bucket, "bad/", adapter_files())
    proxy.rules.append(Rule(match="bad/", fault=Hang(seconds=3)))
    prep = preparer(tmp_path, proxy, endpoint_workers=2, list_timeout_seconds=5.0)
    bad = [item(f"bad{i}", f"s3://{bucket}/bad/", proxy) for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outcomes = [pool.submit(prep.prepare, b, None) for b in bad]
        # Refused at once (no worker waits for the bad endpoint): well within the 3 s hang, on a loaded machine too.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            deferred = [f for f in outcomes if f.done() and isinstance(f.exception(), Deferred)]
            if len(deferred) >= 2:
                break
            time.sleep(0.01)
        assert len(deferred) == 2
        assert prep.gates.holders(proxy.url) == 2 and prep.gates.holders(None) == 0
        upload(s3_env, bucket, "good/", adapter_files(seed=3))
        started = time.monotonic()
        prep.prepare(item("good", f"s3://{bucket}/good/"), None)  # the server's endpoint: not delayed
        assert time.monotonic() - started < 2.0  # the bad endpoint's hang lasts 3 s
    proxy.rules.clear()


def test_downloads_reserve_their_bytes_and_never_overrun_the_limit(
    proxy: FaultProxy, bucket: str, s3_env: str, tmp_path: pathlib.Path
) -> None:
    sizes = {}
    for i in range(4):
        files = big_files(1, seed=i)
        sizes[i] = sum(len(v) for v in files.values())
        upload(s3_env, bucket, f"c{i}/", files)
    limit = sizes[0] * 3 + 4096  # room for three of the four
    proxy.rules.append(Rule(match="/adapter_model", fault=Drip(bytes_per_step=64 << 10, step_seconds=0.02)))
    prep = preparer(tmp_path, proxy, cache_bytes=limit)
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], on_disk(tmp_path) + 0)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(prep.prepare, item(f"c{i}", f"s3://{bucket}/c{i}/", proxy), None) for i in range(4)]
        errors = [f.exception() for f in futures]
    stop.set()
    sampler.join()
    full = [e for e in errors if e is not None]
    print(
        f"cache limit {limit} bytes, 4 concurrent downloads of {sizes[0]}: "
        f"peak on disk {peak[0]}, {len(full)} CacheFull"
    )
    assert len(full) == 1 and isinstance(full[0], TransientError) and full[0].reason is FailureReason.CACHE_FULL
    assert 0 < peak[0] <= limit
    assert prep.reserved_bytes() == 0  # released on completion and on failure


def test_reservations_are_bounded_by_the_disk_as_well_as_the_limit(tmp_path: pathlib.Path) -> None:
    """A cache limit larger than its disk (a restarted pod's small emptyDir): a reservation the disk cannot hold is
    refused, naming the disk, and one that fits is still taken; the real filesystem of tmp_path is asked."""
    disk = os.statvfs(tmp_path)
    free = disk.f_bavail * disk.f_frsize
    prep = preparer(tmp_path, cache_bytes=free + (1 << 40))  # the limit alone would take both
    with pytest.raises(TransientError) as caught:
        prep._reserve("big", free + (1 << 30))
    assert caught.value.reason is FailureReason.CACHE_FULL and "its disk has room for only" in caught.value.message
    prep._reserve("small", 4096)
    assert prep.reserved_bytes() == 4096
    bounded = preparer(tmp_path / "other", cache_bytes=1 << 20)  # the limit is what binds: the message says so
    with pytest.raises(TransientError) as caught:
        bounded._reserve("big", 2 << 20)
    assert "its disk" not in caught.value.message and f"limit {1 << 20}" in caught.value.message


def test_a_retry_refused_for_room_stays_cache_full_without_asking_s3(
    proxy: FaultProxy, bucket: str, s3_env: str, tmp_path: pathlib.Path
) -> None:
    """In a full cache a retry's 5xx must not turn CacheFull into EndpointUnreachable (the S3 chaos run's flip)."""
    upload(s3_env, bucket, "held/", big_files(1, seed=1))
    upload(s3_env, bucket, "wait/", big_files(1, seed=2))
    prep = preparer(tmp_path, proxy, cache_bytes=int(1.5 * MiB))  # room for one of the two
    held = prep.prepare(item("held", f"s3://{bucket}/held/", proxy), None)
    prep.protect({held.version})  # vLLM serves it: never evicted
    waiting = item("wait", f"s3://{bucket}/wait/", proxy)
    with pytest.raises(TransientError) as caught:
        prep.prepare(waiting, None)
    assert caught.value.reason is FailureReason.CACHE_FULL
    proxy.rules.append(Rule(match="/", fault=Status(503)))  # every request fails from now on
    asked = len(proxy.requests)
    with pytest.raises(TransientError) as caught:
        prep.prepare(waiting, None)
    assert caught.value.reason is FailureReason.CACHE_FULL and len(proxy.requests) == asked
    proxy.rules.clear()
    prep.protect(set())  # no longer served: evictable, so the retry asks S3 again and loads
    prep.release(held.version)
    assert prep.prepare(waiting, None).version != held.version and len(proxy.requests) > asked


def test_a_cancelled_download_stops_and_frees_its_bytes(
    proxy: FaultProxy, bucket: str, s3_env: str, tmp_path: pathlib.Path
) -> None:
    upload(s3_env, bucket, "x/", big_files(4))
    proxy.rules.append(Rule(match="x/adapter_model", fault=Drip(bytes_per_step=32 << 10, step_seconds=0.05)))
    prep = preparer(tmp_path, proxy)
    gone = item("x", f"s3://{bucket}/x/", proxy)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(prep.prepare, gone, None)
        time.sleep(0.5)
        assert prep.cancel_stale({}) == [gone.uid]  # deleted: no longer desired
        started = time.monotonic()
        with pytest.raises(Cancelled):
            future.result(timeout=5)
        assert time.monotonic() - started < 1.0
        print(f"cancelled download stopped {time.monotonic() - started:.2f} s after the cancel")
    assert [p for p in tmp_path.iterdir() if not p.name.startswith(".served")] == []  # no partial, no entry
    assert prep.reserved_bytes() == 0 and prep.gates.holders(proxy.url) == 0


class KillAfter:
    """Stands in for the downloaded-bytes counter: raises once `limit` bytes arrived, as a kill mid-download."""

    def __init__(self, limit: float) -> None:
        self.limit, self.seen = limit, 0

    def labels(self, *_: str) -> KillAfter:
        return self

    def inc(self, count: int) -> None:
        self.seen += count
        if self.seen > self.limit:
            raise KeyboardInterrupt("killed")


def test_a_killed_download_resumes_in_a_new_preparer(bucket: str, s3_env: str, tmp_path: pathlib.Path) -> None:
    files = big_files(6)
    total = sum(len(v) for v in files.values())
    upload(s3_env, bucket, "k/", files)
    first = preparer(tmp_path)
    first.metrics.downloaded = KillAfter(3 * MiB)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        first.prepare(item("k", f"s3://{bucket}/k/"), None)
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".part-")]
    manifest = json.loads((partial / MANIFEST).read_text())["files"]
    done = manifest["adapter_model.safetensors"]
    assert 2 * MiB <= done["bytes"] <= 4 * MiB and done["etag"]
    already = sum(entry["bytes"] for entry in manifest.values())

    second = preparer(tmp_path)  # the agent restarted over the same cache volume
    counter = KillAfter(float("inf"))
    second.metrics.downloaded = counter  # type: ignore[assignment]
    prepared = second.prepare(item("k", f"s3://{bucket}/k/"), None)
    weights = (prepared.path / "adapter_model.safetensors").read_bytes()
    assert hashlib.sha256(weights).digest() == hashlib.sha256(files["adapter_model.safetensors"]).digest()
    assert counter.seen <= total - already  # only what was missing (a part finishing late makes it even less)
    print(f"killed after {already} of {total} bytes; the new Preparer fetched {counter.seen}")
    assert not partial.exists()


def test_a_manifest_with_another_etag_starts_that_file_over(bucket: str, s3_env: str, tmp_path: pathlib.Path) -> None:
    files = big_files(3)
    upload(s3_env, bucket, "m/", files)
    first = preparer(tmp_path)
    first.metrics.downloaded = KillAfter(2 * MiB)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        first.prepare(item("m", f"s3://{bucket}/m/"), None)
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".part-")]
    manifest = json.loads((partial / MANIFEST).read_text())
    manifest["files"]["adapter_model.safetensors"]["etag"] = '"another"'
    (partial / MANIFEST).write_text(json.dumps(manifest))
    second = preparer(tmp_path)
    counter = KillAfter(float("inf"))
    second.metrics.downloaded = counter  # type: ignore[assignment]
    prepared = second.prepare(item("m", f"s3://{bucket}/m/"), None)
    assert (prepared.path / "adapter_model.safetensors").read_bytes() == files["adapter_model.safetensors"]
    assert counter.seen >= len(files["adapter_model.safetensors"])


def test_partial_directories_name_their_version(tmp_path: pathlib.Path) -> None:
    assert partial_dir(tmp_path, "abc").name == ".part-abc"
