"""Where an adapter's files are: the S3 location, the client that reaches it, and what its prefix holds.

Listing comes before any download, so an unsafe key, pickle weights, a missing config or a size over the limit
fail the adapter without a byte fetched, and the listing's ETags name the version (the cache directory).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import posixpath
import re
import socket
from collections.abc import Mapping
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from moelora.agent.check.layout import CONFIG_FILE, UNSAFE_SUFFIXES, WEIGHTS_FILE
from moelora.agent.errors import AdapterError, TransientError, quote
from moelora.agent.store import sockets
from moelora.agent.store.guard import Cancelled
from moelora.api import AdapterSource, FailureReason

_ACCESS_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "403",
    "AllAccessDisabled",
    "InvalidToken",
    "ExpiredToken",
}
_MISSING_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_BUSY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "ServiceUnavailable"}
# Refused connections, DNS failures and timeouts (botocore's and the sockets' beneath them).
_UNREACHABLE = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
    ConnectionError,
    TimeoutError,
    socket.gaierror,
)


@dataclasses.dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or ends with "/"

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def check_allowed(
    source: AdapterSource,
    *,
    server_endpoint: str | None,
    allowed_endpoints: tuple[str, ...],
    allowed_buckets: tuple[str, ...],
) -> None:
    """AdapterError(SourceNotAllowed) for a source the operator's policy refuses; called before any network call,
    so a refused endpoint never receives a request (nor the server's credentials)."""
    refusal = source.refusal(
        server_endpoint=server_endpoint, allowed_endpoints=allowed_endpoints, allowed_buckets=allowed_buckets
    )
    if refusal is not None:
        raise AdapterError(FailureReason.SOURCE_NOT_ALLOWED, refusal)


def parse_s3_uri(uri: str) -> S3Location:
    """s3://bucket/some/prefix[/] -> S3Location; the prefix always names a directory (ends with '/')."""
    match = re.fullmatch(r"s3://([^/]+)/?(.*)", uri.strip())
    if not match or not match.group(1):
        raise AdapterError(FailureReason.SOURCE_NOT_FOUND, f"not an s3:// URI: {quote(uri)}")
    prefix = match.group(2)
    if prefix and not prefix.endswith("/"):
        prefix += "/"  # "a/b" must not also match "a/bc/..."
    return S3Location(bucket=match.group(1), prefix=prefix)


@dataclasses.dataclass(frozen=True)
class Credentials:
    """Static S3 credentials; repr never shows them."""

    access_key_id: str = dataclasses.field(repr=False)
    secret_access_key: str = dataclasses.field(repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_secret(cls, data: Mapping[str, str], *, secret_name: str) -> Credentials:
        key_id, secret = data.get("AWS_ACCESS_KEY_ID"), data.get("AWS_SECRET_ACCESS_KEY")
        if not key_id or not secret:
            raise AdapterError(
                FailureReason.SECRET_NOT_FOUND,
                f"Secret {secret_name!r} lacks AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY",
            )
        return cls(access_key_id=key_id, secret_access_key=secret, session_token=data.get("AWS_SESSION_TOKEN") or None)

    def values(self) -> tuple[str, ...]:
        """The secret strings, for redaction."""
        return tuple(v for v in (self.access_key_id, self.secret_access_key, self.session_token) if v)


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """What makes one S3 client differ from another. None: boto3's own resolution (env, IRSA, pod identity)."""

    endpoint_url: str | None = None
    region: str | None = None
    credentials: Credentials | None = None


def make_client(config: ClientConfig, *, max_connections: int = 16, read_timeout: float = 60.0) -> Any:
    """A boto3 S3 client; botocore retries throttling and 5xx itself (standard mode: exponential backoff with
    jitter) before we see an error. `read_timeout` bounds one socket read; deadlines are the caller's (guard.py), and
    a cancelled preparation's connections are shut down (sockets.py)."""
    kwargs: dict[str, Any] = {}
    custom_endpoint = config.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if config.endpoint_url:
        kwargs["endpoint_url"] = config.endpoint_url
    if config.region:
        kwargs["region_name"] = config.region
    if config.credentials is not None:
        kwargs["aws_access_key_id"] = config.credentials.access_key_id
        kwargs["aws_secret_access_key"] = config.credentials.secret_access_key
        kwargs["aws_session_token"] = config.credentials.session_token
    botocore_config = botocore.config.Config(
        retries={"mode": "standard", "max_attempts": 4},
        max_pool_connections=max_connections,
        connect_timeout=5,
        read_timeout=read_timeout,
        # S3-compatible stores (MinIO, moto, a loopback IP) rarely serve virtual-host buckets; AWS itself needs no hint.
        s3={"addressing_style": "path"} if custom_endpoint else {},
    )
    return sockets.track(boto3.session.Session().client("s3", config=botocore_config, **kwargs))


@dataclasses.dataclass(frozen=True)
class RemoteObject:
    key: str  # the full S3 key
    relpath: str  # below the adapter's prefix, '/'-separated
    size: int
    etag: str  # as S3 sends it, quotes included


@dataclasses.dataclass(frozen=True)
class Listing:
    location: S3Location
    objects: tuple[RemoteObject, ...]  # sorted by relpath

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def version(self) -> str:
        """A digest of every (path, ETag, size): names the cache directory, changes when any file changes."""
        digest = hashlib.sha256()
        for obj in self.objects:
            digest.update(f"{obj.relpath}\0{obj.etag.strip(chr(34))}\0{obj.size}\n".encode())
        return digest.hexdigest()[:32]

    def get(self, relpath: str) -> RemoteObject | None:
        return next((o for o in self.objects if o.relpath == relpath), None)


def safe_relpath(key: str, *, prefix: str) -> str:
    """The key's path below `prefix`, or AdapterError(UnsafeKey) if it could land outside the adapter's directory."""
    if not key.startswith(prefix):
        raise AdapterError(FailureReason.UNSAFE_KEY, f"key {quote(key)} is outside prefix {quote(prefix)}")
    rel = key[len(prefix) :]
    parts = rel.split("/")
    if (
        not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\0" in rel
        or re.match(r"^[A-Za-z]:", rel)
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise AdapterError(FailureReason.UNSAFE_KEY, f"key {quote(key)} would escape the adapter's directory")
    if posixpath.normpath(rel) != rel:
        raise AdapterError(FailureReason.UNSAFE_KEY, f"key {quote(key)} is not a normal relative path")
    return rel


def _causes(error: BaseException) -> list[BaseException]:
    """The error and what it wraps (s3transfer's last_exception, __cause__, __context__), nearest first."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo and len(seen) < 8:
        item = todo.pop(0)
        if item is not None and all(item is not s for s in seen):
            seen.append(item)
            todo += [getattr(item, "last_exception", None), item.__cause__, item.__context__]
    return seen


def classify_client_error(error: Exception, *, what: str) -> Exception:
    """An S3/botocore error as AdapterError (access denied, not found) or TransientError (a full cache disk, an
    unreachable endpoint, anything else)."""
    for cause in _causes(error):
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return TransientError(f"{what}: the adapter cache's disk is full", reason=FailureReason.CACHE_FULL)
        if isinstance(cause, _UNREACHABLE):
            return TransientError(
                f"{what}: S3 endpoint unreachable ({type(cause).__name__})", reason=FailureReason.ENDPOINT_UNREACHABLE
            )
    if isinstance(error, botocore.exceptions.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _ACCESS_CODES or status == 403:
            return AdapterError(FailureReason.ACCESS_DENIED, f"{what}: access denied ({quote(code)})")
        if code in _MISSING_CODES or status == 404:
            return AdapterError(FailureReason.SOURCE_NOT_FOUND, f"{what}: not found ({quote(code)})")
        if (isinstance(status, int) and status >= 500) or code in _BUSY_CODES:  # still failing after botocore's retries
            return TransientError(
                f"{what}: S3 error {quote(code or status)} (HTTP {status})", reason=FailureReason.ENDPOINT_UNREACHABLE
            )
        return TransientError(f"{what}: S3 error {quote(code or status)}", reason=FailureReason.SOURCE_NOT_FOUND)
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        return AdapterError(FailureReason.ACCESS_DENIED, f"{what}: no S3 credentials (no Secret, no pod identity)")
    # Connection refused, timeouts, truncated reads: the store may come back.
    return TransientError(f"{what}: {type(error).__name__}", reason=FailureReason.SOURCE_NOT_FOUND)


def list_source(client: Any, *, location: S3Location, max_objects: int = 10000) -> Listing:
    """Every object under the location (directory markers skipped), with keys checked; raises AdapterError
    (SourceNotFound, AccessDenied, UnsafeKey) or TransientError."""
    objects: list[RemoteObject] = []
    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=location.bucket, Prefix=location.prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/") and item.get("Size", 0) == 0:
                    continue  # a "folder" created by a console
                objects.append(
                    RemoteObject(
                        key=key,
                        relpath=safe_relpath(key, prefix=location.prefix),
                        size=int(item["Size"]),
                        etag=str(item.get("ETag", "")),
                    )
                )
                if len(objects) > max_objects:
                    raise AdapterError(
                        FailureReason.TOO_LARGE, f"{quote(str(location))} holds more than {max_objects} objects"
                    )
    except (AdapterError, Cancelled):
        raise
    except Exception as error:  # noqa: BLE001 - classified, never swallowed
        raise classify_client_error(error, what=f"listing {quote(str(location))}") from None
    if not objects:
        raise AdapterError(FailureReason.SOURCE_NOT_FOUND, f"nothing under {quote(str(location))}")
    return Listing(location=location, objects=tuple(sorted(objects, key=lambda o: o.relpath)))


def check_listing(listing: Listing, *, max_bytes: int) -> None:
    """Refuse, before downloading, what the files' names and sizes already condemn."""
    unsafe = [o.relpath for o in listing.objects if o.relpath.lower().endswith(UNSAFE_SUFFIXES)]
    if unsafe:
        raise AdapterError(
            FailureReason.UNSAFE_WEIGHTS_FORMAT,
            f"pickle-format files are refused (use safetensors): {quote(unsafe[:5])}",
        )
    if listing.get(CONFIG_FILE) is None:
        raise AdapterError(FailureReason.CONFIG_MISSING, f"no {CONFIG_FILE} under {quote(str(listing.location))}")
    if listing.get(WEIGHTS_FILE) is None:
        raise AdapterError(FailureReason.WEIGHTS_MISSING, f"no {WEIGHTS_FILE} under {quote(str(listing.location))}")
    if listing.total_bytes > max_bytes:
        raise AdapterError(
            FailureReason.TOO_LARGE,
            f"{listing.total_bytes} bytes under {quote(str(listing.location))}, over the limit of {max_bytes}",
        )
