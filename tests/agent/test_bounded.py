"""guard.bounded, pure: what a call it runs ends with, when its watch is cancelled and when not."""

from __future__ import annotations

import threading

import pytest

from moelora.agent.store.guard import Cancelled, Watch, bounded


def test_a_call_failed_by_its_cancel_ends_as_cancelled_not_as_its_error() -> None:
    # The cancel shuts the call's socket down and the call fails at once, before the waiting loop polls the watch
    # (a long poll here), as when a preparation is cancelled while it reads adapter_config.json.
    watch = Watch(min_rate=0, window=60)

    def read() -> bytes:
        watch.cancelled.wait(5)
        raise ConnectionResetError("reset by the cancel's socket shutdown")

    threading.Timer(0.05, watch.cancel).start()
    with pytest.raises(Cancelled):
        bounded(read, watch=watch, poll=60)


def test_a_call_failed_without_a_cancel_ends_with_its_own_error() -> None:
    def read() -> bytes:
        raise ConnectionResetError("reset by the server")

    with pytest.raises(ConnectionResetError):
        bounded(read, watch=Watch(min_rate=0, window=60), poll=60)
