"""Deleting an adapter frees what its S3 calls held: moto behind a proxy whose bodies drip a byte at a time, each
byte within the read timeout, so no socket timeout would ever end those calls. After the delete, the endpoint's
slots are free and the proxy sees every connection closed, within a bound, where before they stayed open for as long
as the drip lasted."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.agent.store.guard import Cancelled, Watch, working_for
from moelora.agent.store.source import ClientConfig, make_client
from moelora.local.faults import Drip, FaultProxy, Rule

from .conftest import KEYS, adapter_files, eventually, upload
from .test_honest_status import Loop

STEP = 0.3  # seconds between two bytes of a dripping body: far under the read timeout
READ_TIMEOUT = 5.0
BOUND = 3.0  # seconds from the delete to every slot free and every connection closed


@pytest.fixture
def dripping(s3_env: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_env) as proxy:
        yield proxy
        proxy.rules.clear()


def source(bucket: str, prefix: str, proxy: FaultProxy) -> dict[str, object]:
    return {"uri": f"s3://{bucket}/{prefix}/", "endpointUrl": proxy.url, "credentialsSecret": {"name": "tenant"}}


def dripping_loop(tmp_path: pathlib.Path, proxy: FaultProxy, match: str, **changes: Any) -> Loop:
    """An agent loop whose S3 calls all go through the proxy, where the bodies of keys matching `match` drip."""
    proxy.rules.append(Rule(match=match, fault=Drip(bytes_per_step=1, step_seconds=STEP)))
    return Loop(tmp_path / "cache", s3_read_timeout_seconds=READ_TIMEOUT, allowed_s3_endpoints=(proxy.url,), **changes)


def freed_within(loop: Loop, proxy: FaultProxy) -> float:
    """Seconds until the endpoint holds no slot and the proxy answers nothing; fails past BOUND."""
    started = time.monotonic()
    eventually(
        lambda: loop.agent.preparer.gates.holders(proxy.url) == 0 and proxy.inflight == 0,
        timeout=BOUND,
    )
    return time.monotonic() - started


def test_deleting_adapters_whose_listings_hang_frees_their_slots_and_closes_their_sockets(
    tmp_path: pathlib.Path, s3_env: str, bucket: str, dripping: FaultProxy
) -> None:
    proxy = dripping
    loop = dripping_loop(
        tmp_path,
        proxy,
        "drip",
        endpoint_workers=2,
        list_timeout_seconds=1.0,  # the preparations give up; their calls go on dripping, holding both slots
    )
    try:
        for i in range(3):
            upload(s3_env, bucket, f"drip{i}/", adapter_files(seed=i))
            loop.desired.put(f"drip{i}", {"source": source(bucket, f"drip{i}", proxy)})
        eventually(lambda: loop.agent.preparer.gates.stuck(proxy.url), timeout=10)  # both slots held by hung calls
        assert proxy.inflight >= 2
        for i in range(3):
            loop.desired.items.pop(f"drip{i}")
        loop.desired.on_change()
        took = freed_within(loop, proxy)
        print(f"hung listings: slots free and connections closed {took:.2f} s after the delete")

        upload(s3_env, bucket, "next/", adapter_files(seed=9))  # the endpoint serves the next adapter at once
        loop.desired.put("next", {"source": source(bucket, "next", proxy)})
        eventually(lambda: loop.loaded("next"), timeout=10)
    finally:
        loop.stop()


def test_deleting_an_adapter_mid_download_frees_its_slot_and_closes_its_sockets(
    tmp_path: pathlib.Path, s3_env: str, bucket: str, dripping: FaultProxy
) -> None:
    proxy = dripping
    loop = dripping_loop(
        tmp_path,
        proxy,
        "slow/adapter_model",
        min_bytes_per_second=0,  # no rate floor: only the delete may stop it
    )
    try:
        upload(s3_env, bucket, "slow/", adapter_files(seed=1))
        loop.desired.put("slow", {"source": source(bucket, "slow", proxy)})
        eventually(lambda: proxy.fired.get("Drip", 0) >= 1 and proxy.inflight >= 1, timeout=10)
        assert loop.agent.preparer.gates.holders(proxy.url) == 1
        loop.desired.delete("slow")
        took = freed_within(loop, proxy)
        print(f"a dripping download: slot free and connection closed {took:.2f} s after the delete")
        eventually(lambda: not loop.agent.busy, timeout=BOUND)
        assert not [p for p in loop.settings.cache_dir.iterdir() if p.name.startswith(".part-")]
    finally:
        loop.stop()


def test_a_cancelled_watch_cuts_the_call_off_and_refuses_new_ones(
    s3_env: str, bucket: str, dripping: FaultProxy
) -> None:
    """The mechanism alone: a listing blocked on a dripping body ends with Cancelled once its watch is cancelled,
    without a retry on a new connection; a call made for a cancelled watch never reaches the endpoint."""
    import threading

    proxy = dripping
    upload(s3_env, bucket, "drip/", adapter_files(seed=1))
    proxy.rules.append(Rule(match="drip", fault=Drip(bytes_per_step=1, step_seconds=STEP)))
    client = make_client(
        ClientConfig(endpoint_url=proxy.url, region="us-east-1"), read_timeout=READ_TIMEOUT, max_connections=4
    )
    assert KEYS  # the client takes the pod's keys from the environment (s3_env)
    watch = Watch(min_rate=0, window=60)
    outcome: dict[str, BaseException | None] = {}

    def listing() -> None:
        with working_for(watch):
            try:
                client.list_objects_v2(Bucket=bucket, Prefix="drip/")
                outcome["error"] = None
            except BaseException as error:  # noqa: BLE001 - what ended it is the finding
                outcome["error"] = error

    thread = threading.Thread(target=listing, daemon=True)
    thread.start()
    eventually(lambda: proxy.inflight == 1, timeout=5)
    requests = len(proxy.requests)
    time.sleep(2 * STEP)
    started = time.monotonic()
    watch.cancel()
    thread.join(timeout=BOUND)
    assert not thread.is_alive() and isinstance(outcome["error"], Cancelled), outcome
    assert time.monotonic() - started < 1.0
    eventually(lambda: proxy.inflight == 0, timeout=BOUND)
    assert len(proxy.requests) == requests  # not retried
    with working_for(watch), pytest.raises(Cancelled):
        client.list_objects_v2(Bucket=bucket, Prefix="drip/")
    assert len(proxy.requests) == requests
