"""The simulator's core against small cases worked out by hand: disks, on-demand loads, the picker's scores."""

from __future__ import annotations

import pytest
from fleet.core import CPU, DISK, FAILED, FETCH, GPU, Costs, Prompts, Replica, homes, picker, run
from fleet.workload import requests, zipf_shares

# 1 GB adapters: a copy to the GPU takes 0.1 s, a read from disk 0.5 s more; an on-demand fetch and check 1.5 s.
COSTS = Costs(h2d_gbps=10.0, disk_gbps=2.0, fetch_gbps=1.0, check_s_per_gb=0.5)
SIZES = [1.0] * 4


def replica(placed=(), disk_gb=float("inf")) -> Replica:
    return Replica(gpu_slots=1, cpu_slots=2, sizes_gb=SIZES, placed=placed, disk_gb=disk_gb)


def test_costs() -> None:
    assert COSTS.load_seconds(GPU, 1.0) == 0.0
    assert COSTS.load_seconds(CPU, 1.0) == pytest.approx(0.1)
    assert COSTS.load_seconds(DISK, 1.0) == pytest.approx(0.6)
    assert COSTS.fetch_seconds(1.0) == pytest.approx(1.5)


def test_a_replica_serves_an_adapter_it_lacks_then_holds_it_evicting_cold_non_placed_first() -> None:
    r = replica(placed={0}, disk_gb=2.0)
    assert r.serve(1, 0.0, COSTS) == pytest.approx((FETCH, 2.1))  # fetched and checked by 1.5, loaded by 2.1
    assert list(r.disk) == [0, 1] and r.serve(1, 3.0, COSTS) == (GPU, 0.0)
    # adapter 2 needs room: 1 (on demand) goes, 0 (placed) stays; the load waits for the fetch, done at 4.5
    assert r.serve(2, 3.0, COSTS) == pytest.approx((FETCH, 2.1))
    assert list(r.disk) == [0, 2] and r.evictions == 1 and 1 not in r.cpu and 1 not in r.gpu
    assert r.serve(1, 6.0, COSTS)[0] == FETCH and list(r.disk) == [0, 1] and r.evictions == 2
    assert r.serve(0, 10.0, COSTS) == pytest.approx((DISK, 0.6))
    assert r.peak_gb == 2.0


def test_eviction_takes_unloaded_files_first_then_the_least_busy_held_adapter() -> None:
    # As the agent: the cache evicts files vLLM no longer has before the holding drops a loaded adapter
    # (AdapterCache.evict keeps loaded ones), and the holding drops the least busy first (ondemand.coldest).
    r = replica(placed={0}, disk_gb=3.0)
    r.serve(2, 0.0, COSTS)
    r.serve(2, 0.5, COSTS)
    r.serve(1, 1.0, COSTS)  # 1 was asked last, but 2 is busier: 1 goes for 3 (least recently asked would drop 2)
    assert r.load(2, 3.0) > r.load(1, 3.0) > 0
    r.serve(3, 3.0, COSTS)
    assert list(r.disk) == [0, 2, 3]
    r.assign({2}, 4.0, COSTS)  # the operator moves the copy: 0 is unloaded, its files stay
    assert r.unloaded == {0} and r.placed == {2} and 0 not in r.cpu and 0 in r.disk
    r.serve(1, 5.0, COSTS)  # room for 1: 0's files go, not 3 (held) nor 2 (placed)
    assert set(r.disk) == {1, 2, 3} and r.unloaded == set()


def test_unloaded_files_asked_again_are_checked_not_downloaded_and_a_new_copy_arrives_in_the_background() -> None:
    r = replica(placed={0}, disk_gb=4.0)
    r.assign({1}, 0.0, COSTS)  # 1 downloaded and checked by 1.5; 0 unloaded
    assert r.disk[1] == pytest.approx(1.5) and r.unloaded == {0} and r.background == 1
    assert r.serve(1, 1.0, COSTS) == pytest.approx((DISK, 1.1))  # waits for the download, then a disk load
    assert r.serve(0, 2.0, COSTS) == pytest.approx((FETCH, 1.1))  # checks 0.5, disk 0.5, copy 0.1: no download
    assert r.unloaded == set() and r.serve(0, 4.0, COSTS) == (GPU, 0.0)
    r.assign({1, 0}, 5.0, COSTS)  # held on demand, now placed: nothing to fetch
    assert r.placed == {0, 1} and r.disk[0] == pytest.approx(2.5) and r.background == 1


def test_the_operator_runs_on_its_period() -> None:
    calls = []
    run([(t, 0) for t in (0.0, 1.0, 2.5, 3.0, 6.0)], [replica(placed={0})], picker(0), COSTS, service_s=0.1,
        operator=calls.append, every_s=2.0)  # fmt: skip
    assert calls == [2.5, 6.0]


def test_with_placed_adapters_filling_the_disk_an_on_demand_request_fails() -> None:
    # The agent answers vLLM's resolver 503 CacheFull: no room without unloading a placed adapter.
    r = replica(placed={0, 1}, disk_gb=2.0)
    assert r.serve(2, 0.0, COSTS) == (FAILED, 0.0)
    assert list(r.disk) == [0, 1] and r.evictions == 0 and r.loader_free == 0.0
    stats = run([(0.0, 2), (1.0, 0)], [r], picker(0), COSTS, service_s=0.5)
    assert stats.tiers[FAILED] == 1 and stats.requests == 2 and stats.added == [pytest.approx(0.6)]


def test_picker_scores_by_hand() -> None:
    busy, idle = replica(), replica()
    busy.requests = [(0.0, 9.0, 0, 0.0)]  # adapter 0 running: lora 1.0, kv 15/16 -> 2 + 2 x 15/16 + 1 = 4.875
    pick = picker(0, prefix=0)
    assert pick(0, 1.0, [busy, idle]) == 0  # beats the idle pod's 2 + 2 + 0.8 free slot = 4.8
    busy.requests.append((0.0, 9.0, 0, 0.0))  # 2 + 2 x 14/16 + 1 = 4.75: the active adapter no longer wins
    assert pick(0, 1.0, [busy, idle]) == 1
    waiting = replica()
    waiting.requests = [(5.0, 9.0, 3, 0.0)]  # a waiting request: queue score 0, and its one GPU slot is spoken for
    assert pick(3, 1.0, [waiting, idle]) == 1
    assert waiting.metrics(1.0) == (1, 0.0, set(), {3})


def test_prefix_scorer_by_hand() -> None:
    # Prompts of 1 + 1 + 1 hashes (model name, system prompt, own text): a pod the picker sent the adapter to before
    # scores 3 x 2/3 = 2 more, enough to win against an idle pod with a request running (2 + 2 x 15/16 + 2 > 2 + 2).
    def after(others: int) -> tuple[int, int, int]:
        """Adapter 0 to a pod, `others` requests for adapter 1 to the same pod, then where adapter 0 goes."""
        pods = [replica(), replica()]
        pick = picker(0, lora=0, prompts=Prompts(system_blocks=1, user_blocks=1), lru_blocks=6)
        first = pick(0, 0.0, pods)
        other = pods[1 - first]
        other.requests = [(5.0, 9.0, 3, 0.0)]  # waiting: queue score 0, so adapter 1 goes to `first` too
        assert all(pick(1, 1.0, pods) == first for _ in range(others))
        other.requests = []
        pods[first].requests = [(0.0, 9.0, 1, 0.0)]  # kv 15/16: without its prefix the idle pod wins
        stranger = pick(2, 1.0, pods)  # a name never sent: no prefix anywhere
        return first, pick(0, 1.0, pods), stranger

    first, again, stranger = after(1)
    assert again == first and stranger == 1 - first  # adapter 0's 3 hashes and 3 since fit the LRU of 6
    first, again, _ = after(2)
    assert again == 1 - first  # 6 since pushed its first hash (the model name's) out: nothing matches


def test_a_request_shows_in_the_metrics_only_once_its_adapter_is_fetched() -> None:
    # vLLM's API server awaits the resolver before the engine sees the request: no queue, no KV, no LoRA info.
    r = replica()
    stats = run([(0.0, 1)], [r], picker(0), COSTS, service_s=5.0)
    assert stats.tiers[FETCH] == 1 and r.requests == [pytest.approx((2.1, 7.1, 1, 1.5))]
    assert r.metrics(1.0) == (0, 0.0, set(), set())  # the agent is still fetching and checking it
    assert r.metrics(2.0) == (1, 0.0, set(), {1})  # vLLM is loading it: waiting
    assert r.metrics(3.0) == (0, 1 / 16, {1}, set())


def test_picker_does_not_see_disks() -> None:
    holder, stranger = replica(placed={0}), replica()
    picks = {picker(seed)(0, 0.0, [holder, stranger]) for seed in range(20)}
    assert picks == {0, 1}  # an adapter on one disk only: a tie, drawn at random


def holders_only(holders):
    """What the old simulator's router did and no upstream picker does: only replicas holding the adapter."""
    return lambda adapter, now, replicas: holders[adapter][0]


def test_placed_adapters_reach_non_holders_with_the_picker_and_never_with_a_holders_filter() -> None:
    shares = zipf_shares(4, 1.0)
    stream = requests(shares, rate=8.0, count=400, seed=1)
    holders = [[a % 2] for a in range(4)]

    def fleet() -> list[Replica]:
        return [replica(placed={a for a in range(4) if a % 2 == i}, disk_gb=3.0) for i in range(2)]

    upstream = run(stream, fleet(), picker(0), COSTS, service_s=1.0)
    filtered = run(stream, fleet(), holders_only(holders), COSTS, service_s=1.0)
    assert upstream.tiers[FETCH] > 0 and filtered.tiers[FETCH] == 0


def test_warmup_requests_are_not_counted() -> None:
    stats = run([(0.0, 0), (1.0, 0), (2.0, 0)], [replica(placed={0})], picker(0), COSTS, service_s=0.5, warmup=1)
    assert stats.added == [0.0, 0.0] and stats.tiers[GPU] == 2 and stats.quantile(0.99) == 0.0


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


def test_routing_to_homes_sends_an_adapter_to_its_home_alone_and_others_where_the_picker_would() -> None:
    fleets = [[replica() for _ in range(3)] for _ in range(2)]
    route, alone = homes(0, home={0: 2}), picker(0)
    assert {route(0, float(t), fleets[0]) for t in range(20)} == {2}  # however busy its pod gets
    chosen: list[list[int]] = [[], []]
    for t in range(40):  # adapters without a home among all pods, as the picker sends them
        adapter = 1 if t % 2 else 3
        for fleet, router, picks in zip(fleets, (route, alone), chosen):
            pod = router(adapter, float(t), fleet)
            fleet[pod].requests.append((float(t), t + 30.0, adapter, float(t)))
            picks.append(pod)
    assert chosen[0] == chosen[1] and len(set(chosen[0])) > 1
