"""Adapters the agent did not load: unloaded (or put back) by the loop, and reported here.

vLLM's admin routes are the agent's alone (moelora.vllm_plugin.admin_guard), so an adapter the agent did not load
means the guard was bypassed or its key leaked. Each finding is logged, counted and recorded as an Event on the
agent's own Pod. Names come from whoever loaded the adapter: they are escaped and capped before they go anywhere.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import Protocol

from moelora.agent.report.metrics import Metrics

logger = logging.getLogger(__name__)

NAME_LIMIT = 80
UNLOADED = "ForeignAdapterUnloaded"
REPLACED = "ForeignAdapterReplaced"


class EventWriter(Protocol):
    def create_pod_event(self, *, pod: str, pod_uid: str, reason: str, message: str, type: str = "Warning") -> None: ...


def escape(text: str, limit: int = NAME_LIMIT) -> str:
    """`text` as a quoted, escaped literal (no newlines or control characters), at most `limit` characters of it."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class Reporter:
    """Logs, counts and records (as Events, written on `pool` so the loop never waits on the API) what it is told."""

    def __init__(
        self,
        *,
        events: EventWriter,
        metrics: Metrics,
        pod: str,
        pod_uid: str,
        pool: concurrent.futures.Executor,
        own: Callable[[str], bool] = lambda path: False,
    ) -> None:
        self.events = events
        self.own = own
        self.metrics = metrics
        self.pod = pod
        self.pod_uid = pod_uid
        self.pool = pool

    def unloaded(self, *, name: str, path: str) -> None:
        """`own` files came from this agent (its resolver answered just before their LoRAAdapter was deleted): no
        finding, an info line. Anything else is one."""
        if self.own(path):
            logger.info("unloaded adapter %s: its LoRAAdapter went after vLLM's resolver got it", escape(name))
            return
        message = (
            f"unloaded adapter {escape(name)} (from {escape(path)}): vLLM served it, but this agent did not load it"
        )
        self._report(UNLOADED, "unloaded", message)

    def replaced(self, *, name: str, path: str, own: str) -> None:
        message = (
            f"adapter {escape(name)} was replaced in vLLM by the files at {escape(path)}; "
            f"loading the agent's own files ({escape(own)}) again"
        )
        self._report(REPLACED, "replaced", message)

    def _report(self, reason: str, action: str, message: str) -> None:
        logger.warning("%s: %s", reason, message)
        self.metrics.foreign.labels(action).inc()
        try:
            self.pool.submit(self._event, reason, message)
        except RuntimeError:  # the pool is shut down: the agent is stopping
            pass

    def _event(self, reason: str, message: str) -> None:
        try:
            self.events.create_pod_event(pod=self.pod, pod_uid=self.pod_uid, reason=reason, message=message)
        except Exception as error:  # noqa: BLE001 - the log line and the counter already tell it
            logger.warning("could not record the %s Event: %s", reason, type(error).__name__)
