"""Local S3 servers on 127.0.0.1 and uploads into them.

Two independent implementations, so the agent is not written against one server's quirks: moto's server mode in a
thread of this process (always available), and npm's s3rver as a child process (when node and
`node_modules/s3rver` are present: scripts/bootstrap.sh runs `npm install --prefix . s3rver@3.7.1` in the
repository's root). s3rver's multipart ETags have no `-N` suffix, moto's do, like real S3.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from moelora.local import process

S3RVER_JS = pathlib.Path("node_modules") / "s3rver" / "bin" / "s3rver.js"
REGION = "us-east-1"
_OBJECT_GET = re.compile(r'"GET (/[^ ?]+) HTTP')


@dataclasses.dataclass
class S3Server:
    """A running local S3: where it listens and the keys it accepts."""

    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    _stop: Callable[[], None]

    def stop(self) -> None:
        self._stop()

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style addressing: no DNS for bucket subdomains here)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=Config(s3={"addressing_style": "path"}),
        )


def start_moto(
    *, access_key_id: str = "moto-access-key", secret_access_key: str = "moto-secret-key", port: int = 0
) -> S3Server:
    """Start moto's S3 in a daemon thread on `port` (0: a free one). moto accepts any keys; these are handed out.

    Raises OSError if `port` is taken."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise, on stderr
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return S3Server(
        endpoint_url=f"http://{host}:{port}",
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        _stop=server.stop,
    )


class RequestLog(logging.Handler):
    """The paths of the GETs moto's server answers inside `with RequestLog() as log:` (`log.gets`, in order), read
    from werkzeug's request lines: what tests count downloads by."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.gets: list[str] = []
        self._level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        if match := _OBJECT_GET.search(record.getMessage()):
            self.gets.append(match.group(1))

    def __enter__(self) -> RequestLog:
        logger = logging.getLogger("werkzeug")
        self._level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        logger = logging.getLogger("werkzeug")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def find_s3rver(start: pathlib.Path | None = None) -> pathlib.Path | None:
    """s3rver's script in node_modules of `start` (default: the current directory) or of a folder above it, the
    folders Node itself would look in; None if there is none."""
    here = (start or pathlib.Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / S3RVER_JS).is_file():
            return folder / S3RVER_JS
    return None


def s3rver_available() -> bool:
    """True when node and the s3rver package are installed (else tests that need it skip)."""
    return shutil.which("node") is not None and find_s3rver() is not None


def start_s3rver(*, data_dir: pathlib.Path, log_path: pathlib.Path, port: int = 0) -> S3Server:
    """Start s3rver as a child process on `port` (0: a free one), storing into `data_dir`; wait until it answers.

    Raises RuntimeError if node or s3rver is missing (check `s3rver_available()` first) or it does not come up.
    """
    node, script = shutil.which("node"), find_s3rver()
    if node is None or script is None:
        raise RuntimeError(f"s3rver needs node and {S3RVER_JS} here or above (npm install --prefix . s3rver@3.7.1)")
    port = port or process.free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = process.spawn(
        argv=[node, str(script), "-d", str(data_dir), "-a", "127.0.0.1", "-p", str(port), "--silent"],
        env={"PATH": "/usr/bin:/bin"},
        log_path=log_path,
    )
    server = S3Server(
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key_id="S3RVER",
        secret_access_key="S3RVER",
        _stop=lambda: _stop_quietly(proc),
    )
    _wait_s3(server=server, proc=proc, log_path=log_path)
    return server


def _wait_s3(*, server: S3Server, proc: subprocess.Popen[bytes], log_path: pathlib.Path) -> None:
    import time

    import botocore.exceptions

    client = server.client()
    deadline = time.monotonic() + 30
    while True:
        try:
            client.list_buckets()
            return
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionClosedError):
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop_quietly(proc)
                raise RuntimeError(f"s3rver did not come up; see {log_path}") from None
            time.sleep(0.1)


def _stop_quietly(proc: subprocess.Popen[bytes]) -> None:
    process.stop(proc, timeout=5)


def upload_dir(*, server: S3Server, source: pathlib.Path, uri: str) -> list[str]:
    """Upload every file under `source` to `uri` (s3://bucket/prefix/), creating the bucket; return the keys.

    Large files go up in parallel multipart parts (boto3's transfer manager), as a real upload would.
    """
    bucket, prefix = split_uri(uri)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    client = server.client()
    ensure_bucket(client=client, bucket=bucket)
    keys = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(source).as_posix()
        client.upload_file(str(path), bucket, key)
        keys.append(key)
    return keys


def put_object(*, server: S3Server, uri: str, body: bytes) -> None:
    """Write one object at `uri` (s3://bucket/key), creating the bucket."""
    bucket, key = split_uri(uri)
    client = server.client()
    ensure_bucket(client=client, bucket=bucket)
    client.put_object(Bucket=bucket, Key=key, Body=body)


def ensure_bucket(*, client: Any, bucket: str) -> None:
    """Create `bucket` unless it exists."""
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` -> (`bucket`, `some/key`)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, rest = uri[len("s3://") :].partition("/")
    return bucket, rest
