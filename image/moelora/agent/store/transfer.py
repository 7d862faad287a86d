"""Ranged GETs of a listing's objects into a partial directory that survives agent restarts, and resumes.

Each file is cut into parts (one part below the multipart threshold); every GET carries If-Match with the listed
ETag and, for a part, its Range, and the answer's ETag is compared too (some S3-compatible servers, s3rver among
them, ignore If-Match and would hand a replaced object's bytes to a download of the listed one). A finished part is
written to `.manifest.json` (key, ETag, size, parts done, bytes done), so a download interrupted by a crash, a kill
or a slow endpoint continues where it stopped when the same files are fetched again; a file whose ETag or size
differs from the manifest's starts over. The manifest also names the adapter (uid) the download is for, from before
the first GET, so the partials of adapters deleted while the agent was down can be told apart
(AdapterCache.prune_partials). Each chunk read feeds the Watch (deadline, rate floor, cancellation) and is checked
between reads; a part that breaks off (reset, truncated body, 5xx) is retried with backoff and jitter.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from boto3.s3.transfer import TransferConfig

from moelora.agent.errors import AdapterError, TransientError, quote
from moelora.agent.store.guard import Cancelled, Watch, working_for
from moelora.agent.store.source import Listing, RemoteObject, classify_client_error
from moelora.api import FailureReason

_JITTER = random.Random()  # our own: the global generator's state belongs to whoever seeds it

MANIFEST = ".manifest.json"
PART_ATTEMPTS = 3


class ObjectChanged(TransientError):
    """An object no longer has its listed ETag (412): these parts can never complete; list again."""


def same_etag(a: str, b: str) -> bool:
    """ETags compared as S3 clients do: quotes and case ignored."""
    return a.strip('"').lower() == b.strip('"').lower()


class _ShortBody(ConnectionError):
    """The server closed the body before the part's last byte: retried like a reset."""


def _parts(obj: RemoteObject, config: TransferConfig) -> list[tuple[int, int]]:
    """(start, end inclusive) ranges; a single (0, size-1) part below the threshold (and (0, -1) for empty)."""
    if obj.size < config.multipart_threshold:
        return [(0, obj.size - 1)]
    size = config.multipart_chunksize
    return [(start, min(start + size, obj.size) - 1) for start in range(0, obj.size, size)]


class _Manifest:
    """What of each file is already on disk; rewritten atomically after each finished part."""

    def __init__(self, directory: pathlib.Path, listing: Listing, owner: str | None) -> None:
        self.path = directory / MANIFEST
        self.owner = owner
        self._lock = threading.Lock()
        self._closed = False
        try:
            saved = json.loads(self.path.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            saved = {}
        self.files: dict[str, dict[str, Any]] = {}
        for obj in listing.objects:
            old = saved.get(obj.relpath)
            if isinstance(old, dict) and old.get("etag") == obj.etag and old.get("size") == obj.size:
                self.files[obj.relpath] = old
            else:  # other files (or none) under this name: start this one over
                (directory / obj.relpath).unlink(missing_ok=True)
                self.files[obj.relpath] = {"key": obj.key, "etag": obj.etag, "size": obj.size, "done": [], "bytes": 0}

    def done(self, relpath: str) -> set[int]:
        return set(self.files[relpath]["done"])

    def close(self) -> None:
        """No more writes: the download gave up, and its directory may be removed under parts still running."""
        with self._lock:
            self._closed = True

    def finish(self, relpath: str, part: int, length: int) -> None:
        with self._lock:
            if self._closed:
                return
            entry = self.files[relpath]
            entry["done"] = sorted({*entry["done"], part})
            entry["bytes"] += length
            self.save()

    def save(self) -> None:
        temp = self.path.with_suffix(".tmp")
        try:
            temp.write_text(json.dumps({"owner": self.owner, "files": self.files}))
            os.replace(temp, self.path)
        except FileNotFoundError:  # the partial directory was removed (cancelled) under a late part
            pass


def owner(directory: pathlib.Path) -> str | None:
    """The uid of the adapter a partial directory was last downloaded for; None if it does not say."""
    try:
        found = json.loads((directory / MANIFEST).read_text()).get("owner")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def download(
    *,
    client: Any,
    listing: Listing,
    into: pathlib.Path,
    config: TransferConfig,
    watch: Watch,
    on_bytes: Callable[[int], None] | None = None,
    owner: str | None = None,
) -> None:
    """Fetch every listed file into `into` (created if needed), skipping parts its manifest says are done.
    `owner`: the adapter's uid, recorded in the manifest."""
    into.mkdir(parents=True, exist_ok=True)
    manifest = _Manifest(into, listing, owner)
    abort = threading.Event()
    jobs = []
    for obj in listing.objects:
        target = into / obj.relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("ab") as stream:  # exists, keeps what earlier runs wrote
            stream.truncate(obj.size)
        done = manifest.done(obj.relpath)
        jobs += [(obj, i, r) for i, r in enumerate(_parts(obj, config)) if i not in done]
    manifest.save()  # before the first GET: a kill from here on leaves a partial that names its adapter

    def part(obj: RemoteObject, index: int, span: tuple[int, int]) -> None:
        with working_for(watch):  # its connection is shut down if the preparation is cancelled
            _part(obj, index, span)

    def _part(obj: RemoteObject, index: int, span: tuple[int, int]) -> None:
        for attempt in range(PART_ATTEMPTS):
            try:
                _get_part(client, listing, obj, span, into / obj.relpath, config, watch, abort, on_bytes)
                manifest.finish(obj.relpath, index, span[1] - span[0] + 1)
                return
            except (Cancelled, AdapterError, TransientError):
                raise
            except Exception as error:  # noqa: BLE001 - classified below
                what = f"downloading {quote(obj.relpath)}"
                if getattr(error, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                    changed = f"{what}: replaced since it was listed"
                    raise ObjectChanged(changed, reason=FailureReason.SOURCE_NOT_FOUND) from None
                failure = classify_client_error(error, what=what)
                if isinstance(failure, AdapterError) or attempt == PART_ATTEMPTS - 1 or abort.is_set():
                    raise failure from None
            time.sleep(min(2.0, 0.1 * 2**attempt) * _JITTER.uniform(0.5, 1.0))  # backoff with jitter

    executor = concurrent.futures.ThreadPoolExecutor(max(1, config.max_concurrency), thread_name_prefix="part")
    try:
        pending = {executor.submit(part, *job) for job in jobs}
        while pending:
            finished, pending = concurrent.futures.wait(
                pending, timeout=0.1, return_when=concurrent.futures.FIRST_EXCEPTION
            )
            for future in finished:
                future.result()
            watch.check()  # the deadline and the rate floor hold even while no byte arrives
    except BaseException as error:
        abort.set()
        manifest.close()
        watch.sever()  # parts blocked in a read would hold their connections until the read timeout, or forever
        if isinstance(error, Exception) and not isinstance(error, Cancelled) and watch.cancelled.is_set():
            raise Cancelled() from None  # the cancel shut the sockets down: what failed after it is its doing
        raise
    finally:
        executor.shutdown(wait=False, cancel_futures=True)  # the parts end on abort, or once their sockets are shut


def _get_part(
    client: Any,
    listing: Listing,
    obj: RemoteObject,
    span: tuple[int, int],
    target: pathlib.Path,
    config: TransferConfig,
    watch: Watch,
    abort: threading.Event,
    on_bytes: Callable[[int], None] | None,
) -> None:
    if obj.size == 0:
        return
    kwargs: dict[str, Any] = {"Bucket": listing.location.bucket, "Key": obj.key, "IfMatch": obj.etag}
    if span != (0, obj.size - 1) or obj.size >= config.multipart_threshold:
        kwargs["Range"] = f"bytes={span[0]}-{span[1]}"
    response = client.get_object(**kwargs)
    body = response["Body"]
    if response.get("ETag") and not same_etag(str(response["ETag"]), obj.etag):  # a server that ignores If-Match
        body.close()
        raise ObjectChanged(
            f"downloading {quote(obj.relpath)}: replaced since it was listed (ETag {quote(response['ETag'])})",
            reason=FailureReason.SOURCE_NOT_FOUND,
        )
    offset, end = span[0], span[1] + 1
    fd = os.open(target, os.O_WRONLY)
    try:
        while offset < end:
            if abort.is_set():
                raise Cancelled()
            chunk = body.read(min(config.io_chunksize, end - offset))
            if not chunk:
                raise _ShortBody(f"{quote(obj.relpath)}: the body ended {end - offset} bytes short")
            os.pwrite(fd, chunk, offset)
            offset += len(chunk)
            watch.add(len(chunk))
            if on_bytes is not None:
                on_bytes(len(chunk))
            watch.check()
    finally:
        os.close(fd)
        body.close()
