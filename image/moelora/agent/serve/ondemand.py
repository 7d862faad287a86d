"""Adapters served on first request: vLLM's LoRA resolver (moelora.vllm_plugin.resolver) asks this agent for a name
vLLM does not serve, and gets the path of files that passed every check, or a refusal with its reason.

The resolver's request reaches `ResolveServer`, a listener on 127.0.0.1 that wants the admin guard's per-pod key,
and waits in `Resolutions.ask` while the agent's loop does what it does for any adapter: the LoRAAdapter (only one
of this pod's ModelServer) is fetched, checked and validated within the cache's budget, and its output checked.
Then the loop hands the path over (`serve`) instead of loading it itself: vLLM holds the name's lock while its
resolver waits, so a load through the admin API would wait for the resolver that waits for it. vLLM registers the
files, and the loop's next look at `/v1/models` adopts them as Loaded.

With placement, such an adapter is held on demand: kept while there is room, and the first to go (coldest first)
when an adapter needs room in the cache. Without placement every pod desires every adapter of its server, and a
request arriving before its adapter is loaded simply waits for it.
"""

from __future__ import annotations

import dataclasses
import hmac
import http.server
import json
import logging
import os
import pathlib
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from moelora.agent.errors import quote
from moelora.agent.reconcile import Desired, Record, Stage, winners
from moelora.agent.serve.vllm import ADMIN_KEY_HEADER

logger = logging.getLogger(__name__)

# Beside the admin key, on the in-memory volume only the agent and vLLM mount: where the resolver finds the agent.
ADDRESS_FILE = "resolver"
PATH = "/resolve"
MAX_BODY = 4096  # a name is at most 253 characters: anything longer is not a resolver's request


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the resolver is told: 200 with the path vLLM loads, 404 (not an adapter of this server: vLLM's own
    "does not exist"), 422 (refused for good, with the reason), 503 (not servable now: retried, or still on its way)."""

    status: int
    path: str | None = None
    reason: str | None = None
    message: str = ""

    def body(self) -> dict[str, Any]:
        return {"path": self.path} if self.status == 200 else {"reason": self.reason, "message": self.message}


def not_found(name: str, *, model_server: str) -> Answer:
    return Answer(404, reason="NotFound", message=f"no LoRAAdapter of ModelServer {model_server} serves {quote(name)}")


def answer_for(record: Record | None, *, name: str) -> Answer | None:
    """The answer a record gives now, or None while it is on its way (Pending, Preparing, Ready for the hand-over)."""
    if record is None:
        return None
    if record.stage is Stage.LOADED and record.path is not None:
        return Answer(200, path=record.path)
    if record.stage is not Stage.FAILED or record.reason is None:
        return None
    why = f"LoRA adapter {quote(name)} cannot be served on this pod: {record.reason.value}: {record.message or ''}"
    if record.permanent:
        return Answer(422, reason=record.reason.value, message=why)
    return Answer(503, reason=record.reason.value, message=why + " (retried)")


def find(catalogue: Sequence[Desired], name: str) -> Desired | None:
    """The LoRAAdapter of the server that serves `name`: the oldest of those sharing it, as for placed adapters."""
    chosen, _ = winners([item for item in catalogue if item.served_name == name])
    return chosen[0] if chosen else None


@dataclasses.dataclass(frozen=True)
class Held:
    """An adapter held on demand, as eviction sees it."""

    uid: str
    load: float  # requests in flight on this pod, on average (report/usage.py); 0 when not sampled
    since: float  # when a request last asked for it (monotonic)
    size: int  # bytes its files take in the cache


def coldest(held: Iterable[Held], need: int) -> list[str]:
    """The uids to drop to free `need` bytes: the least busy first, then the longest unasked; none when even all of
    them would not free enough (dropping them would serve nobody)."""
    order = sorted(held, key=lambda h: (h.load, h.since, h.uid))
    if sum(h.size for h in order) < need:
        return []
    chosen, freed = [], 0
    for item in order:
        if freed >= need:
            break
        chosen.append(item.uid)
        freed += item.size
    return chosen


class _Ticket:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: Answer | None = None


class Resolutions:
    """Between the resolver's requests (HTTP threads) and the agent's loop. `wake` wakes the loop."""

    def __init__(self, *, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._servable: dict[str, str] = {}  # served name -> files that passed every check, for an answer at once
        self._waiting: dict[str, list[_Ticket]] = {}

    def ask(self, name: str, *, timeout: float) -> Answer:
        """The answer for `name`, waiting for the loop up to `timeout` seconds (then 503)."""
        ticket = _Ticket()
        with self._lock:
            path = self._servable.get(name)
            if path is not None:
                return Answer(200, path=path)
            self._waiting.setdefault(name, []).append(ticket)
        self._wake()
        if ticket.done.wait(timeout):
            assert ticket.answer is not None
            return ticket.answer
        with self._lock:
            waiting = self._waiting.get(name, [])
            if ticket in waiting:
                waiting.remove(ticket)
                if not waiting:
                    del self._waiting[name]
        if ticket.answer is not None:  # answered while the wait ended
            return ticket.answer
        message = f"LoRA adapter {quote(name)} is still being prepared on this pod after {timeout:.0f} s; retry"
        return Answer(503, reason="Preparing", message=message)

    def asked(self) -> list[str]:
        """The names requests wait for now."""
        with self._lock:
            return sorted(self._waiting)

    def waiting(self, name: str) -> bool:
        with self._lock:
            return name in self._waiting

    def serve(self, name: str, path: str) -> None:
        """These files passed every check: the answer for `name`, now and until `servable` says otherwise."""
        with self._lock:
            self._servable[name] = path
            tickets = self._waiting.pop(name, [])
        for ticket in tickets:
            ticket.answer = Answer(200, path=path)
            ticket.done.set()

    def refuse(self, name: str, answer: Answer) -> None:
        with self._lock:
            tickets = self._waiting.pop(name, [])
        for ticket in tickets:
            ticket.answer = answer
            ticket.done.set()

    def withdraw(self, name: str) -> None:
        """No answer at once for `name`: the loop is unloading it, and vLLM's resolver must not load it back from the
        last pass's answer before the next pass refreshes it."""
        with self._lock:
            self._servable.pop(name, None)

    def servable(self, paths: Mapping[str, str]) -> None:
        """What may be answered at once from now on (served name -> path): what the agent serves or has handed over."""
        with self._lock:
            self._servable = dict(paths)


class ResolveServer:
    """`POST /resolve {"name": ...}` on 127.0.0.1 (an ephemeral port, written to `address_file`), for requests
    carrying the pod's admin key; anything else is refused before a name is read."""

    def __init__(
        self, *, resolutions: Resolutions, key: str, timeout: float, address_file: pathlib.Path, host: str = "127.0.0.1"
    ) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] != PATH:
                    self._send(404, {"message": "not found"})
                    return
                offered = (self.headers.get(ADMIN_KEY_HEADER) or "").encode()
                if not offered or not hmac.compare_digest(offered, outer.key.encode()):
                    self._send(403, {"message": "the pod's admin key is required"})
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if not 0 < length <= MAX_BODY:
                        raise ValueError(f"a body of {length} bytes")
                    name = json.loads(self.rfile.read(length))["name"]
                    if not isinstance(name, str) or not name:
                        raise ValueError("no name")
                except (ValueError, KeyError, TypeError) as error:
                    self._send(400, {"message": f"expected {{'name': str}}: {error}"})
                    return
                answer = outer.resolutions.ask(name, timeout=outer.timeout)
                self._send(answer.status, answer.body())

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # the loop logs what it resolves
                pass

        self.resolutions = resolutions
        self.key = key
        self.timeout = timeout
        self.address_file = address_file
        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="resolve-http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()
        write_address(self.address_file, self.url)

    def stop(self) -> None:
        # A stopped agent's address would have vLLM answer 503 for unknown names instead of its own 404.
        try:
            if self.address_file.read_text() == self.url:
                self.address_file.unlink()
        except OSError:
            pass
        self.server.shutdown()
        self.server.server_close()


def write_address(path: pathlib.Path, url: str) -> None:
    """`url` into `path` atomically, readable by its owner only: the resolver reads the old address or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".resolver-", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(url)
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise
