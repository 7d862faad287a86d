"""Download a listed adapter into the content-addressed cache: all or nothing, and only the pinned bytes.

Files go into a partial directory `.part-<version>` beside the cache entries (transfer.py: concurrent ranged GETs
for large files, each part written in place; every GET carries If-Match with the listed ETag, so an object replaced
mid-way fails the download instead of mixing versions; a manifest lets a later fetch of the same version resume).
Only a complete, verified directory is renamed to `<cache>/<version>/`: a directory with that name is complete by
construction. A base model (fetch_tree) still goes through s3transfer into a `.tmp-*` directory.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from s3transfer.subscribers import BaseSubscriber

from moelora.agent.check.layout import CONFIG_FILE, CONFIG_LIMIT, WEIGHTS_FILE
from moelora.agent.errors import AdapterError, TransientError, quote
from moelora.agent.store import transfer
from moelora.agent.store.guard import Cancelled, Watch
from moelora.agent.store.source import Listing, RemoteObject, classify_client_error
from moelora.api import FailureReason, VersionPin

TEMP_PREFIX = ".tmp-"
PARTIAL_PREFIX = ".part-"
MiB = 2**20

# Files over 16 MiB are fetched as 8 MiB ranges, up to 8 at a time; small files go in one GET each, also in parallel.
DEFAULT_TRANSFER = TransferConfig(
    multipart_threshold=16 * MiB,
    multipart_chunksize=8 * MiB,
    max_concurrency=8,
    use_threads=True,
    io_chunksize=256 * 1024,
)


class _Known(BaseSubscriber):
    """Tells s3transfer the size and ETag from the listing, sparing a HEAD per file and pinning ranged GETs."""

    def __init__(self, obj: RemoteObject, on_bytes: Callable[[int], None] | None) -> None:
        self._obj = obj
        self._on_bytes = on_bytes

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self._obj.size)
        future.meta.provide_object_etag(self._obj.etag)

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        if self._on_bytes is not None:
            self._on_bytes(bytes_transferred)


def sha256_file(path: pathlib.Path, *, chunk: int = 1 * MiB) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_etag_pin(listing: Listing, pin: VersionPin | None) -> None:
    """Before downloading: the pinned ETag must be the weights' listed ETag (quotes and case ignored)."""
    if pin is None or pin.etag is None:
        return
    weights = listing.get(WEIGHTS_FILE)
    found = weights.etag.strip('"').lower() if weights else None
    if found != pin.etag.strip('"').lower():
        raise AdapterError(
            FailureReason.VERSION_MISMATCH,
            f"{WEIGHTS_FILE} has ETag {quote(found)}, the pin asks for {quote(pin.etag.strip(chr(34)))}",
        )


def read_config_object(*, client: Any, listing: Listing) -> bytes:
    """adapter_config.json's bytes, read before any weights (pinned to the listed ETag; at most CONFIG_LIMIT)."""
    obj = listing.get(CONFIG_FILE)
    if obj is None:
        raise AdapterError(FailureReason.CONFIG_MISSING, f"no {CONFIG_FILE} under {quote(str(listing.location))}")
    if obj.size > CONFIG_LIMIT:
        raise AdapterError(FailureReason.CONFIG_INVALID, f"{CONFIG_FILE} is {obj.size} bytes, not a config")
    try:
        response = client.get_object(Bucket=listing.location.bucket, Key=obj.key, IfMatch=obj.etag)
        return bytes(response["Body"].read(CONFIG_LIMIT + 1))
    except Cancelled:
        raise
    except Exception as error:  # noqa: BLE001 - classified, never swallowed
        raise classify_client_error(error, what=f"reading {CONFIG_FILE}") from None


def fetch(
    *,
    client: Any,
    listing: Listing,
    cache_dir: pathlib.Path,
    pin: VersionPin | None = None,
    on_bytes: Callable[[int], None] | None = None,
    transfer_config: TransferConfig = DEFAULT_TRANSFER,
    watch: Watch | None = None,
    owner: str | None = None,
) -> pathlib.Path:
    """The adapter's directory `<cache_dir>/<listing.version>`, downloading (or resuming) it unless complete.
    `owner`: the uid of the adapter it is fetched for, recorded in the partial directory (AdapterCache.prune_partials).

    Raises AdapterError (VersionMismatch, AccessDenied, SourceNotFound), TransientError, or Cancelled. The partial
    directory is kept after a TransientError (the next fetch resumes), except a full disk, and removed after
    anything else.
    """
    check_etag_pin(listing, pin)
    final = cache_dir / listing.version
    if final.is_dir():
        _verify_sha256(final, pin)
        return final
    try:
        return _fetch_new(
            client=client,
            listing=listing,
            final=final,
            pin=pin,
            on_bytes=on_bytes,
            transfer_config=transfer_config,
            watch=watch or Watch(min_rate=0, window=float("inf")),
            owner=owner,
        )
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TransientError(
                f"the adapter cache's disk is full ({quote(str(final.parent))})", reason=FailureReason.CACHE_FULL
            ) from None
        raise


def partial_dir(cache_dir: pathlib.Path, version: str) -> pathlib.Path:
    return cache_dir / f"{PARTIAL_PREFIX}{version}"


def _fetch_new(
    *,
    client: Any,
    listing: Listing,
    final: pathlib.Path,
    pin: VersionPin | None,
    on_bytes: Callable[[int], None] | None,
    transfer_config: TransferConfig,
    watch: Watch,
    owner: str | None,
) -> pathlib.Path:
    cache_dir = final.parent
    cache_dir.mkdir(parents=True, exist_ok=True)
    temp = partial_dir(cache_dir, listing.version)
    keep = False
    try:
        try:
            transfer.download(
                client=client,
                listing=listing,
                into=temp,
                config=transfer_config,
                watch=watch,
                on_bytes=on_bytes,
                owner=owner,
            )
        except (AdapterError, Cancelled, transfer.ObjectChanged):
            raise  # bad files, a deleted adapter, or a version that can no longer complete: nothing worth keeping
        except TransientError as error:
            # The parts on disk are good: the next fetch of this version resumes from them. Not on a full disk:
            # kept, they would hold the room other adapters' downloads need, and nothing would free it.
            keep = error.reason is not FailureReason.CACHE_FULL
            raise
        except Exception as error:  # noqa: BLE001 - classified, never swallowed
            failure = classify_client_error(error, what="downloading")
            keep = isinstance(failure, TransientError) and failure.reason is not FailureReason.CACHE_FULL
            raise failure from error
        except BaseException:
            keep = True  # the process is going down: a restarted agent resumes
            raise
        for obj in listing.objects:  # a short read must never pass for a complete file
            size = (temp / obj.relpath).stat().st_size
            if size != obj.size:
                raise AdapterError(
                    FailureReason.VERSION_MISMATCH, f"{quote(obj.relpath)}: got {size} bytes, listed {obj.size}"
                )
        (temp / transfer.MANIFEST).unlink(missing_ok=True)
        _verify_sha256(temp, pin)
        os.chmod(temp, 0o755)  # vLLM may run as another user
        try:
            os.rename(temp, final)
        except OSError:
            if not final.is_dir():  # another worker finishing the same version first is fine
                raise
    finally:
        if not keep:
            shutil.rmtree(temp, ignore_errors=True)
    return final


def _verify_sha256(directory: pathlib.Path, pin: VersionPin | None) -> None:
    if pin is None or pin.sha256 is None:
        return
    found = sha256_file(directory / WEIGHTS_FILE)
    if found != pin.sha256:
        raise AdapterError(
            FailureReason.VERSION_MISMATCH, f"{WEIGHTS_FILE} has sha256 {found}, the pin asks for {pin.sha256}"
        )


def _download_all(
    *,
    client: Any,
    listing: Listing,
    into: pathlib.Path,
    on_bytes: Callable[[int], None] | None,
    transfer_config: TransferConfig,
) -> None:
    # s3transfer pins ranged GETs to the ETag itself but not single GETs, and refuses IfMatch as an extra arg:
    # so every GetObject of this listing gets its If-Match here, and a replaced object fails with 412.
    expected = {(listing.location.bucket, obj.key): obj.etag for obj in listing.objects}

    def pin_etag(params: dict[str, Any], **_: Any) -> None:
        etag = expected.get((str(params.get("Bucket")), str(params.get("Key"))))
        if etag and "IfMatch" not in params:
            params["IfMatch"] = etag

    handler_id = f"moelora-if-match-{id(expected)}"
    client.meta.events.register("before-parameter-build.s3.GetObject", pin_etag, unique_id=handler_id)
    manager = create_transfer_manager(client, transfer_config)
    futures = []
    try:
        for obj in listing.objects:
            target = into / obj.relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            futures.append(
                (
                    obj,
                    manager.download(
                        listing.location.bucket, obj.key, str(target), subscribers=[_Known(obj, on_bytes)]
                    ),
                )
            )
        for obj, future in futures:
            try:
                future.result()
            except AdapterError:
                raise
            except Exception as error:  # noqa: BLE001 - classified, never swallowed
                raise classify_client_error(error, what=f"downloading {quote(obj.relpath)}") from None
    finally:
        manager.shutdown(cancel=any(not f.done() for _, f in futures))
        client.meta.events.unregister("before-parameter-build.s3.GetObject", unique_id=handler_id)


def fetch_tree(
    *, client: Any, listing: Listing, dest: pathlib.Path, transfer_config: TransferConfig = DEFAULT_TRANSFER
) -> None:
    """Download a whole prefix (a base model) into `dest`, which may be a mount point: files land in a temporary
    directory inside it and are moved into place only once all arrived; `.moelora-complete` marks a finished copy."""
    marker = dest / ".moelora-complete"
    if marker.exists() and marker.read_text() == listing.version:
        return
    dest.mkdir(parents=True, exist_ok=True)
    temp = pathlib.Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=dest))
    try:
        _download_all(client=client, listing=listing, into=temp, on_bytes=None, transfer_config=transfer_config)
        for obj in listing.objects:
            target = dest / obj.relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp / obj.relpath, target)
        marker.write_text(listing.version)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
