"""A fault-injecting HTTP proxy on loopback, in front of a local S3 server (or anything HTTP).

Each request is forwarded unchanged (Host header included, so SigV4 signatures still match); a `Rule` whose `match`
occurs in the request's decoded path and query bends the response: `Drip` sends the body a few bytes at a time,
`Hang` waits before answering, `Reset` closes the connection after some body bytes, `Truncate` announces the full
length and sends less, `Status` answers with an error (e.g. 503) instead of forwarding, `Hook` runs a callable
before forwarding (e.g. to replace the object between the listing and its download). A rule may apply a limited
number of times, and to a random share of its matches (`chance`); a rule that does not fire lets the next one try.
The proxy is its own endpoint URL, so an agent sees it as a separate S3 endpoint. Used by the agent's fault tests,
the e2e drip test and the S3 chaos run (benchmarks/chaos_s3.py).
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


@dataclasses.dataclass(frozen=True)
class Drip:
    bytes_per_step: int = 1
    step_seconds: float = 0.2


@dataclasses.dataclass(frozen=True)
class Hang:
    seconds: float


@dataclasses.dataclass(frozen=True)
class Reset:
    after_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Truncate:
    after_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Status:
    code: int = 503


@dataclasses.dataclass(frozen=True)
class Hook:
    call: Callable[[], None]  # runs on the proxy's thread before the request is forwarded


Fault = Drip | Hang | Reset | Truncate | Status | Hook


@dataclasses.dataclass
class Rule:
    match: str  # a substring of the decoded path + query, e.g. a bucket or key prefix
    fault: Fault
    times: int | None = None  # None: every matching request
    methods: tuple[str, ...] = ("GET", "HEAD")
    chance: float = 1.0  # the share of matching requests it applies to (drawn from the proxy's seeded generator)


class FaultProxy:
    """`FaultProxy(upstream).start()`; `.url` is its endpoint; `.rules` may change while it runs."""

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.rules: list[Rule] = []
        self.requests: list[str] = []  # "METHOD path?query" of each request, in order
        self.fired: dict[str, int] = {}  # fault kind -> how many times a rule applied
        self.inflight = 0  # requests being answered now (a dripping body counts until its last byte)
        self.lock = threading.Lock()
        self.random = random.Random(seed)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def _fault_for(self, method: str, target: str) -> Fault | None:
        decoded = urllib.parse.unquote(target)
        with self.lock:
            self.requests.append(f"{method} {decoded}")
            for rule in self.rules:
                if method in rule.methods and rule.match in decoded and (rule.times is None or rule.times > 0):
                    if rule.chance < 1.0 and self.random.random() >= rule.chance:
                        continue
                    if rule.times is not None:
                        rule.times -= 1
                    kind = type(rule.fault).__name__
                    self.fired[kind] = self.fired.get(kind, 0) + 1
                    return rule.fault
        return None

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _any(self) -> None:
                with proxy.lock:
                    proxy.inflight += 1
                try:
                    self._answer()
                finally:
                    with proxy.lock:
                        proxy.inflight -= 1

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._fault_for(self.command, self.path)
                if isinstance(fault, Status):
                    payload = f"<Error><Code>ServiceUnavailable</Code><Message>injected {fault.code}</Message></Error>"
                    self.send_response(fault.code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload.encode())
                    return
                if isinstance(fault, Hang):
                    time.sleep(fault.seconds)
                if isinstance(fault, Hook):
                    fault.call()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:  # an upstream gone (a test's server stopped) just closes the client's connection
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    self.send_response(response.status, response.reason)
                    for key, value in response.getheaders():
                        if key.lower() not in HOP_HEADERS and key.lower() != "content-length":
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                except OSError:
                    self.close_connection = True
                    return
                finally:
                    upstream.close()
                if self.command == "HEAD":
                    return
                self._send_body(data, fault)

            def _send_body(self, data: bytes, fault: Fault | None) -> None:
                try:
                    if isinstance(fault, Drip):
                        for start in range(0, len(data), fault.bytes_per_step):
                            self.wfile.write(data[start : start + fault.bytes_per_step])
                            self.wfile.flush()
                            time.sleep(fault.step_seconds)
                    elif isinstance(fault, Reset | Truncate):
                        self.wfile.write(data[: fault.after_bytes])
                        self.wfile.flush()
                        if isinstance(fault, Reset):  # RST instead of FIN: SO_LINGER with a zero timeout
                            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                        self.close_connection = True
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up: its own business
                    self.close_connection = True

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        return Handler
