"""The two ways preparing or loading an adapter can fail: for good (a reason in its status) or for now (retry)."""

from __future__ import annotations

from collections.abc import Iterable

from moelora.api import FailureReason


class AdapterError(Exception):
    """A permanent failure of one adapter: retrying the same files will not help. Its reason goes to the status."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message
        self.version: str | None = None  # the listed files it was judged on, when known


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
