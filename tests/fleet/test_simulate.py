"""The simulator's CLI on a small cell: the six layouts, observed copies, every moved copy counted."""

from __future__ import annotations

from fleet import simulate
from fleet.core import FETCH
from fleet.workload import zipf_shares

from moelora.operator.decide import placement


def test_a_small_cell() -> None:
    args = simulate.parse(["--requests", "4000", "--window", "1000"])
    blind, on_demand, everywhere, placed, following, pooled = simulate.cells(args, adapters=60, replicas=4)
    assert [c.layout for c in (blind, on_demand, everywhere, placed, following, pooled)] == [
        "adapter-blind",
        "on demand only",
        "all-on-all",
        "placement",
        "placement following load",
        "routing to homes",
    ]
    assert {c.stats.requests for c in (blind, on_demand, everywhere, placed, following, pooled)} == {3200}
    assert everywhere.stats.tiers[FETCH] == 0 and placed.stats.tiers[FETCH] > 0
    # Nothing placed: every adapter a pod serves it loads on demand, and the blind picker spreads them the most.
    assert blind.stats.tiers[FETCH] > on_demand.stats.tiers[FETCH] > 0 and blind.copies == on_demand.copies == 0
    assert everywhere.disk_gb == 60 * args.adapter_gb and placed.disk_gb < everywhere.disk_gb
    assert (everywhere.added, everywhere.removed) == (60, 0)  # the new pod downloads every adapter
    copies = simulate.observed_copies(args, zipf_shares(60, 1.0), 4)
    homes, budget = simulate.place([args.adapter_gb] * 60, copies, 4, None)
    assert max(blind.disk_gb, on_demand.disk_gb, placed.disk_gb) <= budget  # the same disks
    grown = simulate.observed_copies(args, zipf_shares(60, 1.0), 5, current=copies)
    scaled = simulate.place([args.adapter_gb] * 60, grown, 5, budget, current=dict(homes.homes))[0]
    moves = placement.plan(homes.homes, scaled.homes)
    assert (placed.added, placed.removed) == (len(moves.loads), len(moves.unloads))
    assert placed.moved == placement.moved(homes.homes, scaled.homes) == max(placed.added, placed.removed, placed.moved)
    # Following load: the operator moved copies while serving (every 60 s of a ~250 s stream), to where the picker
    # sent their adapters, and so fewer requests loaded on demand than with the copies where they started.
    assert (
        following.replaced > 0
        and following.downloaded <= following.replaced
        and following.disk_gb <= budget
        and following.stats.requests == 3200
    )
    assert following.stats.tiers[FETCH] < placed.stats.tiers[FETCH]
    # Routing to homes: one copy of each adapter but those on every pod, and on-demand loads only for requests the
    # picker sends to a pod where an evicted adapter no longer is.
    everywhere_count = sum(count >= 4 for count in copies.values())
    assert 0 < everywhere_count < 60 and pooled.copies == 60 + 3 * everywhere_count and pooled.disk_gb <= budget
    assert pooled.stats.tiers[FETCH] < placed.stats.tiers[FETCH]


def test_copies_come_from_a_noisy_window_not_the_shares() -> None:
    shares = zipf_shares(200, 1.0)
    seeds = [simulate.observed_copies(simulate.parse(["--seed", str(s), "--window", "400"]), shares, 8) for s in (0, 1)]
    assert seeds[0] != seeds[1]


def test_main_prints_the_table(capsys) -> None:
    simulate.main(["--adapters", "30", "--replicas", "2,3", "--requests", "500", "--window", "300"])
    out = capsys.readouterr().out
    layouts = ("placement", "placement following load", "all-on-all", "adapter-blind", "routing to homes")
    assert all(out.count(f"| {layout} |") == 2 for layout in layouts)
