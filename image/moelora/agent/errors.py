"""The two ways preparing or loading an adapter can fail: for good (a reason in its status) or for now (retry)."""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from typing import Any

from moelora.api import FailureReason


class AdapterError(Exception):
    """A permanent failure of one adapter: retrying the same files will not help. Its reason goes to the status."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message
        self.version: str | None = None  # the listed files it was judged on, when known
        self.facts: Any = None  # validate.AdapterInfo: what the files said before the refusal (status.rank...)


class TransientError(Exception):
    """A failure that may pass (S3 or vLLM unreachable, throttled, 5xx, an object changed mid-download): retry later.

    `reason` is what the status reports if the retries run out.
    """

    def __init__(self, message: str, *, reason: FailureReason = FailureReason.LOAD_FAILED) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret value replaced, for anything that leaves the process (logs, status, events)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


class _Capped(reprlib.Repr):
    """reprlib with small limits, and big integers summarised (repr of an int over 4300 digits raises ValueError)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple, self.maxset = 3, 6, 6, 6, 6
        self.maxstring = self.maxother = self.maxlong = 80

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_CAPPED = _Capped()
QUOTE_LIMIT = 120


def quote(value: Any, *, limit: int = QUOTE_LIMIT) -> str:
    """An untrusted value (S3 key, tensor name, config value, a message from vLLM) as it may appear in a log line,
    status message or event: repr-quoted, so newlines and control characters show escaped, and at most `limit`
    characters long. Every such value goes through here."""
    if isinstance(value, str):
        text = repr(value[:limit]) + (f"...(+{len(value) - limit} chars)" if len(value) > limit else "")
    else:
        text = _CAPPED.repr(value)
    return text if len(text) <= limit + 24 else text[:limit] + "..."
