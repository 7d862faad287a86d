"""Findings of the S3 chaos run (benchmarks/chaos_s3.py): an object replaced after its listing on a server that
ignores If-Match (s3rver) must not be stored under the listed version; an endpoint that keeps answering 5xx is
EndpointUnreachable, not SourceNotFound; a download that runs the disk full gives its bytes back."""

from __future__ import annotations

import errno
import os
import pathlib

import botocore.exceptions
import pytest

from moelora.agent.errors import TransientError
from moelora.agent.store.source import classify_client_error
from moelora.api import FailureReason
from moelora.local import s3 as local_s3
from moelora.local.faults import FaultProxy, Hook, Rule

from .conftest import adapter_files, upload
from .test_resilience import big_files, item, preparer


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    response = {"Error": {"Code": code, "Message": "injected"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "ListObjectsV2")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (503, "ServiceUnavailable", FailureReason.ENDPOINT_UNREACHABLE),
        (500, "InternalError", FailureReason.ENDPOINT_UNREACHABLE),
        (503, "SlowDown", FailureReason.ENDPOINT_UNREACHABLE),
        (400, "Throttling", FailureReason.ENDPOINT_UNREACHABLE),
        (400, "InvalidArgument", FailureReason.SOURCE_NOT_FOUND),
    ],
)
def test_5xx_and_throttling_after_retries_are_the_endpoints(status: int, code: str, reason: FailureReason) -> None:
    failure = classify_client_error(client_error(status, code), what="listing")
    assert isinstance(failure, TransientError) and failure.reason is reason


@pytest.mark.slow
@pytest.mark.skipif(not local_s3.s3rver_available(), reason="needs node and node_modules/s3rver")
def test_an_object_replaced_after_its_listing_is_not_stored_as_the_listed_version(tmp_path: pathlib.Path) -> None:
    server = local_s3.start_s3rver(data_dir=tmp_path / "s3", log_path=tmp_path / "s3rver.log")
    try:
        s3 = server.client()
        local_s3.ensure_bucket(client=s3, bucket="bucket")
        first, second = adapter_files(seed=1), adapter_files(seed=2)["adapter_model.safetensors"]
        for key, body in first.items():
            s3.put_object(Bucket="bucket", Key=f"r/{key}", Body=body)

        def replace() -> None:  # the weights change on the server when their GET arrives, after the listing
            s3.put_object(Bucket="bucket", Key="r/adapter_model.safetensors", Body=second)

        with FaultProxy(server.endpoint_url) as proxy:
            proxy.rules.append(Rule(match="r/adapter_model", fault=Hook(replace), times=1))
            prep = preparer(tmp_path / "cache", proxy)
            prep.kube.secrets["tenant"] = {  # type: ignore[attr-defined]
                "AWS_ACCESS_KEY_ID": server.access_key_id,
                "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
            }
            with pytest.raises(TransientError) as caught:  # s3rver ignored If-Match: the answer's ETag gave it away
                prep.prepare(item("r", "s3://bucket/r/", proxy), None)
            assert "replaced since it was listed" in caught.value.message
            assert proxy.rules[0].times == 0
            assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]  # nothing stored
            prepared = prep.prepare(item("r", "s3://bucket/r/", proxy), None)  # listed again: the new version
            assert (prepared.path / "adapter_model.safetensors").read_bytes() == second
    finally:
        server.stop()


def test_a_download_that_fills_the_disk_gives_its_bytes_back(
    s3_env: str, bucket: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload(s3_env, bucket, "f/", big_files(3))
    real_pwrite, written = os.pwrite, [0]

    def pwrite(fd: int, data: bytes, offset: int) -> int:  # the file layer of a disk with 1 MiB left
        if written[0] + len(data) > 1 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        written[0] += len(data)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    prep = preparer(tmp_path)
    with pytest.raises(TransientError) as caught:
        prep.prepare(item("f", f"s3://{bucket}/f/"), None)
    assert caught.value.reason is FailureReason.CACHE_FULL and "disk is full" in caught.value.message
    assert written[0] > 0  # it did write before the disk ran out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".part-")] == []  # the room is free again
    assert prep.reserved_bytes() == 0


def test_adapters_waiting_on_a_hung_endpoint_say_so(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    from moelora.local.faults import Hang

    from .conftest import KEYS, MemoryDesired, MemoryKube, eventually
    from .test_faults_loop import FakeVllm, Loop

    kube, desired = MemoryKube(), MemoryDesired()
    kube.secrets["tenant"] = dict(KEYS)
    desired.synced.set()
    with FaultProxy(s3_env) as proxy:
        proxy.rules.append(Rule(match="/hung", fault=Hang(seconds=20)))
        # Two slots for the endpoint; the read timeout outlives the test, so given-up listings keep their slots.
        loop = Loop(
            tmp_path / "cache",
            FakeVllm(),
            kube,
            desired,
            endpoint_workers=2,
            s3_read_timeout_seconds=30.0,
            allowed_s3_endpoints=(proxy.url,),
        )
        source = {"endpointUrl": proxy.url, "credentialsSecret": {"name": "tenant"}}
        for i in range(4):
            upload(s3_env, bucket, f"hung{i}/", adapter_files(seed=i))
            desired.put(f"hung{i}", {"source": {"uri": f"s3://{bucket}/hung{i}/", **source}})

        def reasons() -> list[str | None]:
            return [kube.status[f"hung{i}"][0].reason if f"hung{i}" in kube.status else None for i in range(4)]

        eventually(lambda: reasons() == ["EndpointUnreachable"] * 4, timeout=10)  # none Pending without a word
        messages = {kube.status[f"hung{i}"][0].last_error for i in range(4)}
        assert any("deadline" in (m or "") for m in messages) and any("hangs" in (m or "") for m in messages)
        proxy.rules.clear()
        loop.stop()


def test_a_deleted_adapter_takes_its_partial_download_with_it(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    from moelora.local.faults import Reset

    upload(s3_env, bucket, "p/", big_files(2))
    with FaultProxy(s3_env) as proxy:
        proxy.rules.append(Rule(match="p/adapter_model", fault=Reset(after_bytes=1000)))  # every time: it gives up
        prep = preparer(tmp_path, proxy)
        with pytest.raises(TransientError):
            prep.prepare(item("p", f"s3://{bucket}/p/", proxy), None)
        partials = [p for p in tmp_path.iterdir() if p.name.startswith(".part-")]
        assert len(partials) == 1  # kept for the next attempt
        assert prep.prune_partials(desired={"uid-q"}) == [partials[0].name.removeprefix(".part-")]  # "p" is deleted
        assert not partials[0].exists()


def test_a_transient_failure_is_still_retried_once_it_counts_as_failed() -> None:
    from moelora.agent.reconcile import Desired, Record, plan
    from moelora.api import LoRAAdapterSpec

    spec = LoRAAdapterSpec.model_validate({"modelServer": "srv", "source": {"uri": "s3://bkt/a/"}})
    item = Desired(uid="uid-a", name="a", created="2026-01-01T00:00:00Z", spec=spec)
    flaky = Record(uid=item.uid, name=item.name, served_name=item.served_name, spec_hash=item.spec_hash)
    for _ in range(6):  # six 503s in a row: Failed for readiness and the phase, not given up on
        flaky.fail(FailureReason.ENDPOINT_UNREACHABLE, "S3 error 503", permanent=False, now=0.0)
    assert flaky.permanent and flaky.state().state.value == "Failed"
    assert plan(desired=[item], records={item.uid: flaky}, loaded={}, busy=set(), now=61.0).prepare == [item.uid]
    bad = Record(uid=item.uid, name=item.name, served_name=item.served_name, spec_hash=item.spec_hash)
    bad.fail(FailureReason.RANK_TOO_HIGH, "rank 64", permanent=True, now=0.0)  # bad files: not until they change
    assert plan(desired=[item], records={item.uid: bad}, loaded={}, busy=set(), now=61.0).prepare == []


def test_readiness_looks_again_when_its_wait_ends_and_often_while_vllm_is_down() -> None:
    from moelora.agent.report.metrics import Metrics
    from moelora.agent.report.readiness import ReadyGate

    gate = ReadyGate(wait_seconds=25.0, metrics=Metrics())
    gate.update(vllm_up=False, unsettled=["a"], now=0.0)
    assert gate.next_wake(now=0.0, poll=5.0) == 1.0  # a restarted vLLM is seen within a second
    gate.update(vllm_up=True, unsettled=["a"], now=10.0)
    assert gate.next_wake(now=33.0, poll=5.0) == 2.0  # the wait ends at 35: not at the next 5 s poll
    gate.update(vllm_up=True, unsettled=["a"], now=35.0)
    assert gate.open and gate.next_wake(now=35.0, poll=5.0) == 5.0
