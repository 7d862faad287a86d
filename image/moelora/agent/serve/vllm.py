"""A client of vLLM's runtime LoRA API (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and its health and model list.

vLLM answers a load with 200; 400 when the name is taken (unless load_inplace) or is the base model's; 404 when
the path does not exist; 500 for anything the engine raised while loading (no tensors, rank over
--max-lora-rank, shape mismatch). `classify_load_error` turns those into failure reasons; connection errors and
503s are transient (vLLM starting or restarting) and retried with backoff.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from moelora.agent.errors import AdapterError, TransientError, quote
from moelora.agent.reconcile import LoadedAdapter
from moelora.api import FailureReason

# _request's status for a request that timed out: vLLM is there but busy (a dead one refuses the connection: 0).
SLOW = -1


class VllmSlow(TransientError):
    """vLLM took longer than the poll to answer: it is alive but busy, which says nothing about its adapters."""


class Duplicate(Exception):
    """vLLM already has an adapter of this name (and load_inplace was not asked)."""


def classify_load_error(status: int, message: str) -> Exception:
    """vLLM's answer to a failed load as Duplicate, AdapterError (permanent) or TransientError."""
    lowered = message.lower()
    if status == 400 and "already been loaded" in lowered:
        return Duplicate(message)
    if status == 400 and "conflicts with a served base model" in lowered:
        return AdapterError(FailureReason.NAME_CONFLICT, message)
    if status in (401, 403):  # the agent's keys, not the adapter, are wrong: retry, the pod stays unready meanwhile
        return TransientError(f"vLLM refused the agent ({status}): {message}")
    if status == 404:  # our directory vanished (evicted, volume lost): download again
        return TransientError(f"vLLM cannot find the adapter's files: {message}")
    if status in (502, 503, 504) or status == 0:
        return TransientError(f"vLLM unavailable ({status}): {message}")
    if "greater than max_lora_rank" in lowered or "lora rank" in lowered and "max_lora_rank" in lowered:
        return AdapterError(FailureReason.RANK_TOO_HIGH, message)
    if "target modules" in lowered or "expected_lora_modules" in lowered or "unsupported lora" in lowered:
        return AdapterError(FailureReason.UNSUPPORTED_TARGET_MODULES, message)
    return AdapterError(FailureReason.LOAD_FAILED, message)


ADMIN_KEY_HEADER = "X-Moelora-Admin-Key"  # what moelora.vllm_plugin.admin_guard checks


class VllmClient:
    """`admin_key`: the pod's key for the admin guard; `api_key`: the clients' API key (spec.apiKeySecret)."""

    def __init__(
        self,
        *,
        base_url: str,
        timeout: float = 60.0,
        attempts: int = 3,
        backoff: float = 0.5,
        admin_key: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers: dict[str, str] = {}
        if admin_key:
            self._headers[ADMIN_KEY_HEADER] = admin_key
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """(status, body) for any HTTP answer; status 0 when vLLM could not be reached."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self._headers, **({"Content-Type": "application/json"} if data else {})}
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (OSError, urllib.error.URLError) as error:
            if isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError):
                return SLOW, str(error).encode()
            return 0, str(error).encode()

    def _with_retries(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        """Retry only what says nothing about the request: unreachable vLLM and 502-504."""
        delay = self.backoff
        for attempt in range(self.attempts):
            status, payload = self._request(method, path, body)
            if status not in (0, 502, 503, 504) or attempt == self.attempts - 1:
                return status, payload
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def healthy(self) -> bool:
        """True when vLLM answers /health with 200 (one try: the caller polls)."""
        return self._request("GET", "/health", timeout=5)[0] == 200

    def metrics_text(self) -> str | None:
        """vLLM's Prometheus /metrics (one try, 5 s); None when it does not answer 200."""
        status, payload = self._request("GET", "/metrics", timeout=5)
        return payload.decode(errors="replace") if status == 200 else None

    def adapters(self, *, poll: float | None = None) -> dict[str, LoadedAdapter]:
        """The LoRA adapters vLLM serves now, by name; raises TransientError when it cannot tell.

        `poll`: the caller asks again every `poll` seconds, so one try bounded by it, not retries: a vLLM that died
        must show in the status at the next poll, not after the retries' backoff."""
        if poll is not None:
            status, payload = self._request("GET", "/v1/models", timeout=max(1.0, poll))
        else:
            status, payload = self._with_retries("GET", "/v1/models")
        if status == SLOW:
            raise VllmSlow("vLLM /v1/models did not answer in time")
        if status != 200:
            raise TransientError(f"vLLM /v1/models answered {status}")
        cards = json.loads(payload).get("data", [])
        return {
            card["id"]: LoadedAdapter(name=card["id"], path=card.get("root") or "", parent=card.get("parent"))
            for card in cards
            if card.get("parent")
        }

    def load(self, *, name: str, path: str, inplace: bool = False) -> None:
        """Register (or with inplace, replace) an adapter; raises Duplicate, AdapterError or TransientError."""
        status, payload = self._with_retries(
            "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": inplace}
        )
        if status != 200:
            raise classify_load_error(status, _message(payload))

    def canary(self, *, name: str) -> None:
        """One greedy token of the one-token prompt [0] from adapter `name`, with its logprob; raises
        AdapterError(OutputNonFinite) when that logprob is not finite, TransientError when vLLM cannot tell.

        vLLM's JSON encoder refuses NaN and infinity: such a logprob comes back as HTTP 400 "Out of range float
        values are not JSON compliant". A token-id prompt gets no BOS added, so it is one token on every model."""
        body = {"model": name, "prompt": [0], "max_tokens": 1, "temperature": 0, "logprobs": 0}
        status, payload = self._with_retries("POST", "/v1/completions", body)
        message = _message(payload) if status != 200 else ""
        if status == 400 and "out of range float" in message.lower():
            raise AdapterError(
                FailureReason.OUTPUT_NON_FINITE, f"vLLM computed a non-finite logprob with this adapter: {message}"
            )
        if status != 200:
            raise TransientError(f"vLLM answered the adapter's output check with {status}: {message}")
        try:
            choice = json.loads(payload)["choices"][0]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        except (ValueError, KeyError, IndexError, TypeError):
            raise TransientError(f"vLLM answered the output check without logprobs: {quote(payload[:200])}") from None
        if not logprobs or not all(math.isfinite(x) for x in logprobs):
            raise AdapterError(
                FailureReason.OUTPUT_NON_FINITE, f"vLLM computed the logprobs {quote(logprobs)} with this adapter"
            )

    def unload(self, *, name: str) -> bool:
        """Unregister an adapter; False if vLLM did not have it, TransientError if vLLM is unreachable."""
        status, payload = self._with_retries("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if status == 200:
            return True
        if status == 404:
            return False
        raise TransientError(f"vLLM unload of {name!r} answered {status}: {_message(payload)}")


def _message(payload: bytes) -> str:
    """vLLM's error message, escaped: it may quote tensor names or paths from the adapter's files."""
    try:
        body = json.loads(payload)
    except ValueError:
        return quote(payload.decode(errors="replace"), limit=500)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return quote(str(error["message"]), limit=2000)
    if isinstance(body, dict) and "message" in body:
        return quote(str(body["message"]), limit=2000)
    return quote(payload.decode(errors="replace"), limit=500)


class AdapterPoller:
    """What vLLM serves, asked every `poll` seconds; None while it is down.

    A refused connection (a dead vLLM) counts at once; a late answer (a busy one) keeps the last answer for a few
    polls, so a loaded machine does not flip every adapter to not loaded and back.
    """

    SLOW_POLLS_TOLERATED = 3

    def __init__(self, client: VllmClient, *, poll: float) -> None:
        self.client = client
        self.poll_seconds = poll
        self.last: dict[str, LoadedAdapter] | None = None
        self.slow = 0  # polls in a row answered too late

    def poll(self) -> dict[str, LoadedAdapter] | None:
        try:
            self.last, self.slow = self.client.adapters(poll=self.poll_seconds), 0
        except VllmSlow:
            self.slow += 1
            if self.slow >= self.SLOW_POLLS_TOLERATED:
                self.last = None
        except TransientError:
            self.last = None
        return self.last


class HealthWatch:
    """Wakes the agent's loop as soon as vLLM's /health changes (asked every `interval` s, a second at most each), so
    a killed vLLM shows in the status within about `interval`, not a whole poll, and a restarted one gets its
    adapters back as soon as it serves. Only a wake-up: what vLLM serves is still the poll's to say."""

    def __init__(self, client: VllmClient, *, on_change: Callable[[], None], interval: float = 0.5) -> None:
        self.client = client
        self.on_change = on_change
        self.interval = interval
        self.healthy: bool | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """Ask once; True (and the loop woken) when the answer differs from the last one."""
        healthy = self.client._request("GET", "/health", timeout=min(1.0, self.interval * 2))[0] == 200
        changed = healthy != self.healthy
        self.healthy = healthy
        if changed:
            self.on_change()
        return changed

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()
