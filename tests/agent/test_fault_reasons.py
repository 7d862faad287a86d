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
from moelora.agent.source import classify_client_error
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
