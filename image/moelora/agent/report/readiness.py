"""The pod's readiness: wait for its adapters after (re)start, but only so long.

A new pod, or one whose vLLM restarted (forgetting every adapter), takes traffic once every desired adapter is
loaded or failed for good, or `wait_seconds` after vLLM came up, whichever is first: adapters still on their way
then (a hanging S3 endpoint, a huge download) are logged and counted in `moelora_agent_pending_adapters`, and their
status entries say where each one is. Once open, the gate closes only when vLLM stops answering: an adapter added
to a serving ModelServer must not take every replica out of its Service while it downloads.
"""

from __future__ import annotations

import logging

from moelora.agent.report.metrics import Metrics

logger = logging.getLogger(__name__)


class ReadyGate:
    def __init__(self, *, wait_seconds: float, metrics: Metrics) -> None:
        self.wait_seconds = wait_seconds
        self.metrics = metrics
        self.open = False
        self._up_since: float | None = None  # when vLLM last came up (monotonic)

    def update(self, *, vllm_up: bool, unsettled: list[str], now: float) -> None:
        self.metrics.pending.set(len(unsettled))
        if not vllm_up:
            self.open, self._up_since = False, None
        elif self._up_since is None:
            self._up_since = now
        if vllm_up and not self.open:
            assert self._up_since is not None
            if not unsettled:
                self.open = True
            elif now - self._up_since >= self.wait_seconds:
                self.open = True
                shown = ", ".join(unsettled[:20]) + (f" (+{len(unsettled) - 20} more)" if len(unsettled) > 20 else "")
                logger.warning(
                    "ready after waiting %.0f s for adapters; %d still on their way: %s",
                    self.wait_seconds,
                    len(unsettled),
                    shown,
                )
        self.metrics.ready.set(1 if self.open else 0)

    def next_wake(self, *, now: float, poll: float) -> float:
        """Seconds until the loop should look again: at the wait's end exactly, and every second while vLLM is
        down (a restarted vLLM noticed late, or a wait ended late, would each add up to a poll to readiness)."""
        if self._up_since is None:
            return min(poll, 1.0)
        if not self.open:
            return max(0.05, min(poll, self._up_since + self.wait_seconds - now))
        return poll
