"""How busy each adapter keeps this pod, for placement's copiesMode Auto: sampled from vLLM, reported as `load`.

vLLM 0.32 counts no requests per adapter. Its one LoRA metric is the gauge `vllm:lora_requests_info`: a series per
set of adapters with requests running or waiting (labels `running_lora_adapters`, `waiting_lora_adapters`, names
joined by commas, no counts), whose value is the time that set was last current; the series with the latest value
is the set in flight now. Sampled at every poll, the share `b` of samples in which an adapter is in flight
estimates the chance that it has a request in the pod at a random moment. If its requests in flight at a moment
are Poisson-distributed (independent arrivals: M/G/inf), that chance is 1 - exp(-L) for L requests in flight on
average, so L = -ln(1 - b). `b` is an exponentially weighted mean over about `window` seconds, capped at 0.99, so
L is at most 4.6: an adapter always in flight on the pod reads near that cap however many requests it holds, which
is what the gauge cannot tell.

The value reported changes only when the estimate moves by half or more, or to or from zero, so an adapter's
status is rewritten rarely (every pod writes its own entry of every adapter it holds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from prometheus_client.parser import text_string_to_metric_families

from moelora.agent.reconcile import Record, Stage

METRIC = "vllm:lora_requests_info"
_CAP = 0.99  # b at 1 would be infinitely many requests in flight
_STEP = 1.5  # a reported value is replaced when the estimate is this many times larger or smaller
_ZERO = 0.01  # requests in flight below this are reported as none
_MIN_GAP = 1.0  # seconds between samples: the loop also wakes on every event, which must not fetch /metrics each time


def in_flight(metrics_text: str) -> set[str] | None:
    """The adapters with requests running or waiting now, from vLLM's /metrics text; None without the gauge."""
    lines = [line for line in metrics_text.splitlines() if line.startswith(METRIC + "{")]
    if not lines:
        return None
    latest = None
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if latest is None or sample.value > latest.value:
                latest = sample
    if latest is None:
        return None
    names = latest.labels.get("running_lora_adapters", "") + "," + latest.labels.get("waiting_lora_adapters", "")
    return {name for name in names.split(",") if name}


class LoadSampler:
    """Per served name: the weighted share of samples in flight, and the requests in flight last reported."""

    def __init__(self, *, window_seconds: float) -> None:
        self.window = max(window_seconds, 1.0)
        self.busy: dict[str, float] = {}
        self.reported: dict[str, float] = {}
        self.last: float | None = None

    def update(self, *, fetch: Callable[[], str | None], records: Iterable[Record], now: float) -> None:
        """Sample vLLM's gauge (`fetch`: its /metrics text, None when away) and set each loaded record's `load`."""
        loaded = [record for record in records if record.stage is Stage.LOADED]
        if self.last is None or now - self.last >= _MIN_GAP:
            text = fetch()
            busy_now = in_flight(text) if text is not None else None
            if busy_now is not None:  # no gauge before vLLM's first LoRA request: nothing to sample yet
                self.sample(busy_now, names=[record.served_name for record in loaded], now=now)
        for record in loaded:
            record.load = self.load(record.served_name)

    def sample(self, busy_now: set[str], *, names: Iterable[str], now: float) -> None:
        """One sample at `now` (monotonic seconds) for the adapters `names` this pod serves."""
        # The first sample only starts the clock: one look is no share of time.
        weight = 0.0 if self.last is None else 1.0 - math.exp(-max(0.0, now - self.last) / self.window)
        self.last = now
        names = set(names)
        for gone in set(self.busy) - names:
            del self.busy[gone]
            self.reported.pop(gone, None)
        for name in names:
            before = self.busy.get(name, 0.0)
            self.busy[name] = before + weight * ((1.0 if name in busy_now else 0.0) - before)
            self._report(name)

    def _report(self, name: str) -> None:
        estimate = -math.log(1.0 - min(self.busy[name], _CAP))
        estimate = round(estimate, 2) if estimate >= _ZERO else 0.0
        previous = self.reported.get(name)
        if previous is None or (previous == 0.0) != (estimate == 0.0):
            self.reported[name] = estimate
        elif estimate > 0.0 and max(estimate / previous, previous / estimate) >= _STEP:
            self.reported[name] = estimate

    def load(self, name: str) -> float | None:
        """Requests in flight on this pod, on average (as last reported); None before the first sample."""
        return self.reported.get(name)
