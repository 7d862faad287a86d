"""The simulator's core against small cases worked out by hand: tiers, LRU evictions, queued loads, routing."""

from __future__ import annotations

import pytest
from fleet.core import CPU, DISK, GPU, Costs, Replica, affinity, random_spread, round_robin, run
from fleet.workload import requests, zipf_shares

# 1 GB adapters: a copy to the GPU takes 0.1 s, a read from disk 0.5 s more.
COSTS = Costs(h2d_gbps=10.0, disk_gbps=2.0)
SIZES = [1.0, 1.0, 1.0]


def fleet() -> list[Replica]:
    return [Replica(gpu_slots=1, cpu_slots=2) for _ in range(2)]


def test_load_costs() -> None:
    assert COSTS.load_seconds(GPU, 1.0) == 0.0
    assert COSTS.load_seconds(CPU, 1.0) == pytest.approx(0.1)
    assert COSTS.load_seconds(DISK, 1.0) == pytest.approx(0.6)


def test_round_robin_by_hand() -> None:
    stream = [(0.0, 0), (0.1, 0), (0.2, 1), (0.3, 0), (2.0, 0), (2.1, 2), (3.0, 2), (4.0, 1)]
    stats = run(stream, fleet(), round_robin(), SIZES, COSTS, service_s=10.0)
    # r0 -> R0 disk 0.6. r1 -> R1 disk 0.6. r2 -> R0 disk, queued behind r0's load: 0.6 -> 1.2, waits 1.0.
    # r3 -> R1: on the GPU but loading until 0.7, waits 0.4. r4 -> R0: evicted from the GPU by 1, still in CPU: 0.1.
    # r5 -> R1 disk 0.6. r6 -> R0 disk 0.6 (CPU evicts 1, the least recent). r7 -> R1: CPU held {0, 2}: disk 0.6.
    assert stats.added == pytest.approx([0.6, 0.6, 1.0, 0.4, 0.1, 0.6, 0.6, 0.6])
    assert stats.tiers == {GPU: 1, CPU: 1, DISK: 6}
    assert stats.cpu_hit() == pytest.approx(1 / 7)
    assert stats.busy_s == pytest.approx(6 * 0.6 + 0.1)
    assert stats.span_s == pytest.approx(4.0)
    assert stats.quantile(0.5) == pytest.approx(0.6) and stats.quantile(0.99) == pytest.approx(1.0)


def test_affinity_by_hand() -> None:
    holders = [[0, 1], [1], [0]]
    stream = [(0.0, 0), (0.1, 0), (0.2, 0), (2.0, 1), (2.0, 0)]
    stats = run(stream, fleet(), affinity(holders), SIZES, COSTS, service_s=1.0)
    # r0: both idle, R0 (first-ranked): disk 0.6, busy until 1.6. r1: R1 idle: disk 0.6. r2: one each in flight,
    # R0: loading until 0.6, waits 0.4. r3: only R1 holds adapter 1: disk 0.6. r4: R0's requests ended at 1.6, R1
    # has r3: R0, on the GPU: nothing added.
    assert stats.added == pytest.approx([0.6, 0.6, 0.4, 0.6, 0.0])
    assert stats.tiers == {GPU: 2, CPU: 0, DISK: 3}


def test_warmup_requests_are_not_counted() -> None:
    stream = [(0.0, 0), (1.0, 0), (2.0, 0)]
    stats = run(stream, fleet()[:1], round_robin(), SIZES, COSTS, service_s=1.0, warmup=1)
    assert stats.added == [0.0, 0.0] and stats.tiers[GPU] == 2 and stats.span_s == 1.0


def test_zipf_shares_and_seeded_requests() -> None:
    assert zipf_shares(3, 1.0).tolist() == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    shares = zipf_shares(50, 1.0)
    first = requests(shares, rate=10.0, count=2000, seed=7)
    assert first == requests(shares, rate=10.0, count=2000, seed=7)
    assert first != requests(shares, rate=10.0, count=2000, seed=8)
    times = [t for t, _ in first]
    assert times == sorted(times)
    assert times[-1] == pytest.approx(200.0, rel=0.1)
    assert sum(adapter == 0 for _, adapter in first) / 2000 == pytest.approx(shares[0], abs=0.03)


def test_gpu_first_prefers_an_active_holder_within_the_slack() -> None:
    replicas = fleet()
    replicas[1].gpu[0] = 0.0
    replicas[1].finishes = [9.0, 9.0]
    pick = affinity([[0, 1]], slack=2)
    assert pick(0, 1.0, replicas) == 1  # two more in flight than replica 0: still within the slack
    replicas[1].finishes.append(9.0)
    assert pick(0, 1.0, replicas) == 0  # three more: the least-loaded holder wins
    assert affinity([[0, 1]])(0, 1.0, replicas) == 0


def test_random_spread_is_seeded() -> None:
    replicas = fleet()
    router_a, router_b = random_spread(3), random_spread(3)
    picks = [router_a(0, 0.0, replicas) for _ in range(50)]
    assert picks == [router_b(0, 0.0, replicas) for _ in range(50)] and set(picks) == {0, 1}
