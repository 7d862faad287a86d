"""Both local S3 servers take an adapter upload and give the same bytes back."""

from __future__ import annotations

import pathlib

import pytest

from moelora.local import s3


def _roundtrip(server: s3.S3Server, adapter: pathlib.Path) -> None:
    keys = s3.upload_dir(server=server, source=adapter, uri="s3://adapters/team/a1")
    assert keys == ["team/a1/adapter_config.json", "team/a1/adapter_model.safetensors"]
    body = server.client().get_object(Bucket="adapters", Key="team/a1/adapter_model.safetensors")["Body"].read()
    assert body == (adapter / "adapter_model.safetensors").read_bytes()
    s3.put_object(server=server, uri="s3://adapters/other/x.bin", body=b"x")  # bucket exists: no error
    listed = server.client().list_objects_v2(Bucket="adapters", Prefix="team/")["KeyCount"]
    assert listed == 2


def test_moto(tiny: dict[str, pathlib.Path]) -> None:
    server = s3.start_moto()
    try:
        _roundtrip(server, tiny["a1"])
        with pytest.raises(Exception, match="NoSuchKey"):
            server.client().get_object(Bucket="adapters", Key="team/a1/missing")
    finally:
        server.stop()


@pytest.mark.skipif(not s3.s3rver_available(), reason="node or node_modules/s3rver missing")
def test_s3rver(tmp_path: pathlib.Path, tiny: dict[str, pathlib.Path]) -> None:
    server = s3.start_s3rver(data_dir=tmp_path / "data", log_path=tmp_path / "s3rver.log")
    try:
        _roundtrip(server, tiny["a1"])
    finally:
        server.stop()


def test_split_uri() -> None:
    assert s3.split_uri("s3://b/p/q/") == ("b", "p/q/")
    assert s3.split_uri("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        s3.split_uri("http://b/p")
