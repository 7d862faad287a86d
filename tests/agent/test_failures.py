"""Failures that are not the adapter's: a full cache disk and an unreachable S3 endpoint get their own reasons, and
untrusted values reach messages only through quote()."""

from __future__ import annotations

import errno
import pathlib
import socket

import boto3
import botocore.config
import botocore.exceptions
import pytest

from moelora.agent.errors import TransientError, quote
from moelora.agent.settings import from_env
from moelora.agent.store import fetch as fetch_module
from moelora.agent.store.source import Listing, RemoteObject, S3Location, classify_client_error, list_source
from moelora.api import FailureReason

from .test_settings import ENV


@pytest.mark.parametrize(
    "error, reason",
    [
        (OSError(errno.ENOSPC, "No space left on device"), FailureReason.CACHE_FULL),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), FailureReason.CACHE_FULL),
        (
            botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3.invalid"),
            FailureReason.ENDPOINT_UNREACHABLE,
        ),
        (botocore.exceptions.ConnectTimeoutError(endpoint_url="http://s3"), FailureReason.ENDPOINT_UNREACHABLE),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://s3"), FailureReason.ENDPOINT_UNREACHABLE),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), FailureReason.ENDPOINT_UNREACHABLE),
        (socket.gaierror(-2, "Name or service not known"), FailureReason.ENDPOINT_UNREACHABLE),
        (RuntimeError("something else"), FailureReason.SOURCE_NOT_FOUND),
    ],
)
def test_errors_are_classified_by_their_cause(error: Exception, reason: FailureReason) -> None:
    classified = classify_client_error(error, what="listing")
    assert isinstance(classified, TransientError) and classified.reason is reason


def test_a_wrapped_cause_is_found() -> None:
    outer = RuntimeError("retries exceeded")
    outer.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert classify_client_error(outer, what="downloading").reason is FailureReason.CACHE_FULL  # type: ignore[attr-defined]


def test_a_refused_connection_is_endpoint_unreachable_not_source_not_found() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        config=botocore.config.Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2),
    )
    with pytest.raises(TransientError) as caught:
        list_source(client, location=S3Location(bucket="b", prefix="p/"))
    assert caught.value.reason is FailureReason.ENDPOINT_UNREACHABLE
    assert "unreachable" in caught.value.message


def test_a_full_cache_disk_is_cache_full(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(**_: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fetch_module.transfer, "download", full)
    listing = Listing(
        location=S3Location(bucket="b", prefix="p/"),
        objects=(
            RemoteObject(key="p/adapter_model.safetensors", relpath="adapter_model.safetensors", size=1, etag="e"),
        ),
    )
    with pytest.raises(TransientError) as caught:
        fetch_module.fetch(client=None, listing=listing, cache_dir=tmp_path)
    assert caught.value.reason is FailureReason.CACHE_FULL


def test_quote_escapes_and_caps() -> None:
    assert quote("a\nb\x00c\u202e") == "'a\\nb\\x00c\\u202e'"
    long = quote("k" * 10_000)
    assert len(long) < 200 and long.endswith("(+9880 chars)")
    assert quote(int("9" * 4000)).startswith("<integer of")  # repr of such an int would raise
    assert len(quote(list(range(10_000)))) < 200
    assert quote(None) == "None"


def test_the_base_model_config_setting() -> None:
    assert from_env(ENV).base_model_config is None
    settings = from_env({**ENV, "MOELORA_BASE_MODEL_CONFIG": " /models/base/config.json "})
    assert settings.base_model_config == pathlib.Path("/models/base/config.json")
