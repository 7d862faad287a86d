"""Downloads from a real S3 server (moto): content-addressed, all-or-nothing, pinned, ranged for large files."""

import hashlib
import os
import pathlib

import pytest
from boto3.s3.transfer import TransferConfig

from moelora.agent.errors import AdapterError, TransientError
from moelora.agent.store import transfer
from moelora.agent.store.fetch import fetch, fetch_tree
from moelora.agent.store.guard import Cancelled, Watch
from moelora.agent.store.source import ClientConfig, Listing, RemoteObject, list_source, make_client, parse_s3_uri
from moelora.api import FailureReason, VersionPin
from moelora.local import s3 as local_s3

from .conftest import adapter_files, s3_client, upload

SMALL_PARTS = TransferConfig(multipart_threshold=1 << 20, multipart_chunksize=1 << 20, max_concurrency=4)


def contents(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_download_into_a_content_addressed_directory(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    files = {**adapter_files(), "sub/readme.txt": b"hello"}
    upload(s3_env, bucket, "team/a1/", files)
    client = make_client(ClientConfig())
    listing = list_source(client, location=parse_s3_uri(f"s3://{bucket}/team/a1"))
    counted: list[int] = []
    path = fetch(client=client, listing=listing, cache_dir=tmp_path, on_bytes=counted.append)
    assert path == tmp_path / listing.version
    assert contents(path) == files
    assert sum(counted) == sum(len(d) for d in files.values())
    assert sorted(os.listdir(tmp_path)) == [listing.version]  # no temporaries left
    again: list[int] = []
    assert fetch(client=client, listing=listing, cache_dir=tmp_path, on_bytes=again.append) == path
    assert again == []  # already complete: nothing downloaded


def test_large_files_come_in_concurrent_ranged_gets(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    files = adapter_files(extra_bytes=5 << 20)
    from boto3.s3.transfer import S3Transfer

    # A multipart upload, so the ETag is not an MD5 but "<hash>-<parts>", as real S3 gives for large files.
    source = tmp_path / "src.safetensors"
    source.write_bytes(files["adapter_model.safetensors"])
    S3Transfer(s3_client(s3_env), SMALL_PARTS).upload_file(str(source), bucket, "big/adapter_model.safetensors")
    upload(s3_env, bucket, "big/", {"adapter_config.json": files["adapter_config.json"]})
    client = make_client(ClientConfig())
    ranges: list[str] = []
    client.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: ranges.append(params.get("Range", ""))
    )
    listing = list_source(client, location=parse_s3_uri(f"s3://{bucket}/big/"))
    assert listing.get("adapter_model.safetensors").etag.strip('"').endswith("-2")
    path = fetch(
        client=client,
        listing=listing,
        cache_dir=tmp_path / "cache",
        transfer_config=SMALL_PARTS,
        pin=VersionPin(etag=listing.get("adapter_model.safetensors").etag.strip('"')),
    )
    assert contents(path) == files
    assert sum(1 for r in ranges if r.startswith("bytes=")) == 6


def test_sha256_pin(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    files = adapter_files()
    upload(s3_env, bucket, "p/", files)
    client = make_client(ClientConfig())
    listing = list_source(client, location=parse_s3_uri(f"s3://{bucket}/p"))
    good = hashlib.sha256(files["adapter_model.safetensors"]).hexdigest()
    with pytest.raises(AdapterError) as caught:
        fetch(client=client, listing=listing, cache_dir=tmp_path, pin=VersionPin(sha256="0" * 64))
    assert caught.value.reason is FailureReason.VERSION_MISMATCH
    assert os.listdir(tmp_path) == []  # the downloaded but wrong files are gone, no partial directory
    assert contents(fetch(client=client, listing=listing, cache_dir=tmp_path, pin=VersionPin(sha256=good))) == files


def test_etag_pin_mismatch_fails_before_downloading(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    upload(s3_env, bucket, "p/", adapter_files())
    client = make_client(ClientConfig())
    listing = list_source(client, location=parse_s3_uri(f"s3://{bucket}/p"))
    seen: list[int] = []
    with pytest.raises(AdapterError) as caught:
        fetch(client=client, listing=listing, cache_dir=tmp_path, pin=VersionPin(etag="abc"), on_bytes=seen.append)
    assert caught.value.reason is FailureReason.VERSION_MISMATCH and seen == []
    assert not tmp_path.exists() or os.listdir(tmp_path) == []


def test_object_replaced_after_listing_fails_and_leaves_nothing(
    s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    upload(s3_env, bucket, "p/", adapter_files(seed=1))
    client = make_client(ClientConfig())
    listing = list_source(client, location=parse_s3_uri(f"s3://{bucket}/p"))
    upload(s3_env, bucket, "p/", {"adapter_model.safetensors": adapter_files(seed=2)["adapter_model.safetensors"]})
    with pytest.raises(TransientError):  # If-Match with the listed ETag: 412, retried later with a fresh listing
        fetch(client=client, listing=listing, cache_dir=tmp_path)
    assert os.listdir(tmp_path) == []


def test_object_deleted_after_listing_fails_and_leaves_nothing(
    s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    upload(s3_env, bucket, "p/", adapter_files())
    client = make_client(ClientConfig())
    listing = list_source(client, location=parse_s3_uri(f"s3://{bucket}/p"))
    s3_client(s3_env).delete_object(Bucket=bucket, Key="p/adapter_model.safetensors")
    with pytest.raises((AdapterError, TransientError)):
        fetch(client=client, listing=listing, cache_dir=tmp_path)
    assert os.listdir(tmp_path) == []


def test_missing_bucket_and_empty_prefix(s3_env: str, bucket: str) -> None:
    client = make_client(ClientConfig())
    for uri in (f"s3://no-such-bucket-{bucket}/x", f"s3://{bucket}/nothing-here"):
        with pytest.raises(AdapterError) as caught:
            list_source(client, location=parse_s3_uri(uri))
        assert caught.value.reason is FailureReason.SOURCE_NOT_FOUND


def test_unsafe_key_in_the_bucket_is_refused(s3_env: str, bucket: str) -> None:
    upload(s3_env, bucket, "p/", {**adapter_files(), "x\\..\\..\\evil": b"x"})
    with pytest.raises(AdapterError) as caught:
        list_source(make_client(ClientConfig()), location=parse_s3_uri(f"s3://{bucket}/p"))
    assert caught.value.reason is FailureReason.UNSAFE_KEY


def test_explicit_endpoint_and_credentials(s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter naming its own endpoint and Secret needs nothing from the pod's environment."""
    from moelora.agent.store.source import Credentials

    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    upload(s3_endpoint, bucket, "p/", adapter_files())
    creds = Credentials(access_key_id="k", secret_access_key="very-secret-value")
    assert "very-secret-value" not in repr(creds)
    client = make_client(ClientConfig(endpoint_url=s3_endpoint, region="eu-west-1", credentials=creds))
    assert len(list_source(client, location=parse_s3_uri(f"s3://{bucket}/p")).objects) == 2


def test_fetch_tree_for_a_base_model(s3_env: str, bucket: str, tmp_path: pathlib.Path) -> None:
    files = {"config.json": b"{}", "model.safetensors": b"w" * 1000, "tok/tokenizer.json": b"{}"}
    upload(s3_env, bucket, "models/tiny/", files)
    client = make_client(ClientConfig())
    listing = list_source(client, location=parse_s3_uri(f"s3://{bucket}/models/tiny"))
    fetch_tree(client=client, listing=listing, dest=tmp_path)
    got = contents(tmp_path)
    assert got.pop(".moelora-complete") == listing.version.encode()
    assert got == files


@pytest.mark.integration
@pytest.mark.skipif(not local_s3.s3rver_available(), reason="needs node and node_modules/s3rver")
def test_against_s3rver_too(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second, independent S3 implementation: its multipart ETags have no -N suffix, pins must still work."""
    from moelora.agent.store.source import Credentials

    server = local_s3.start_s3rver(data_dir=tmp_path / "data", log_path=tmp_path / "s3rver.log")
    try:
        files = adapter_files(extra_bytes=6 << 20)
        (tmp_path / "src").mkdir()
        for name, data in files.items():
            (tmp_path / "src" / name).write_bytes(data)
        local_s3.upload_dir(server=server, source=tmp_path / "src", uri="s3://adapters/team/a/")
        creds = Credentials(access_key_id=server.access_key_id, secret_access_key=server.secret_access_key)
        client = make_client(ClientConfig(endpoint_url=server.endpoint_url, region="us-east-1", credentials=creds))
        listing = list_source(client, location=parse_s3_uri("s3://adapters/team/a"))
        etag = listing.get("adapter_model.safetensors").etag.strip('"')
        path = fetch(
            client=client,
            listing=listing,
            cache_dir=tmp_path / "cache",
            transfer_config=SMALL_PARTS,
            pin=VersionPin(etag=etag),
        )
        assert contents(path) == files
        with pytest.raises(AdapterError) as caught:
            fetch(client=client, listing=listing, cache_dir=tmp_path / "cache2", pin=VersionPin(etag=etag + "0"))
        assert caught.value.reason is FailureReason.VERSION_MISMATCH
    finally:
        server.stop()


class _CutOffByCancel:
    """An S3 client whose GET is cut off by the cancel: the download's socket is shut down mid-request."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def get_object(self, **_: object) -> None:
        self.watch.cancel()
        raise ConnectionResetError("connection reset by peer")


def test_an_error_after_a_cancel_is_the_cancel_not_an_unreachable_endpoint(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen under load: the cancel shut the download's sockets down and the error that followed surfaced as
    # EndpointUnreachable (a failure recorded for a deleted adapter) instead of Cancelled. On a part's last attempt
    # that error ends the part before the download's loop sees the cancel.
    monkeypatch.setattr(transfer, "PART_ATTEMPTS", 1)
    watch = Watch(min_rate=0, window=float("inf"))
    obj = RemoteObject(key="a/adapter_model.safetensors", relpath="adapter_model.safetensors", size=10, etag='"e"')
    listing = Listing(location=parse_s3_uri("s3://b/a/"), objects=(obj,))
    with pytest.raises(Cancelled):
        fetch(client=_CutOffByCancel(watch), listing=listing, cache_dir=tmp_path, watch=watch)
    assert list(tmp_path.iterdir()) == []  # a cancelled fetch keeps none of its bytes
