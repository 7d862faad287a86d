"""Requests for the simulator: Zipf-distributed adapter popularity and Poisson arrivals, fixed by a seed."""

from __future__ import annotations

import numpy as np


def zipf_shares(adapters: int, exponent: float) -> np.ndarray:
    """Each adapter's share of all requests, adapter 0 the most popular: proportional to 1 / rank**exponent."""
    weights = 1.0 / np.arange(1, adapters + 1, dtype=float) ** exponent
    return weights / weights.sum()


def requests(shares: np.ndarray, *, rate: float, count: int, seed: int) -> list[tuple[float, int]]:
    """`count` requests (arrival time in seconds, adapter index): Poisson arrivals at `rate` per second in all."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=count))
    chosen = rng.choice(len(shares), size=count, p=shares)
    return list(zip(times.tolist(), chosen.tolist()))
