"""The simulator's CLI on a small cell: both layouts on one router, observed copies, every moved copy counted."""

from __future__ import annotations

from fleet import simulate
from fleet.core import FETCH
from fleet.workload import zipf_shares

from moelora.operator import placement


def test_a_small_cell() -> None:
    args = simulate.parse(["--requests", "3000", "--window", "1000"])
    everywhere, placed = simulate.cells(args, adapters=60, replicas=4)
    assert {everywhere.stats.requests, placed.stats.requests} == {2400}
    assert everywhere.stats.tiers[FETCH] == 0 and placed.stats.tiers[FETCH] > 0
    assert everywhere.disk_gb == 60 * args.adapter_gb and placed.disk_gb < everywhere.disk_gb
    assert (everywhere.added, everywhere.removed) == (60, 0)  # the new pod downloads every adapter
    copies = simulate.observed_copies(args, zipf_shares(60, 1.0), 4)
    homes, budget = simulate.place([args.adapter_gb] * 60, copies, 4, None)
    grown = simulate.observed_copies(args, zipf_shares(60, 1.0), 5, current=copies)
    moves = placement.plan(homes.homes, simulate.place([args.adapter_gb] * 60, grown, 5, budget)[0].homes)
    assert (placed.added, placed.removed) == (len(moves.loads), len(moves.unloads))
    # copies added without any removed (more copies on more replicas, or a spill) count too
    assert placed.added > len({unload.adapter for unload in moves.unloads})


def test_copies_come_from_a_noisy_window_not_the_shares() -> None:
    shares = zipf_shares(200, 1.0)
    seeds = [simulate.observed_copies(simulate.parse(["--seed", str(s), "--window", "400"]), shares, 8) for s in (0, 1)]
    assert seeds[0] != seeds[1]


def test_main_prints_the_table(capsys) -> None:
    simulate.main(["--adapters", "30", "--replicas", "2,3", "--requests", "500", "--window", "300"])
    out = capsys.readouterr().out
    assert out.count("| placement |") == 2 and out.count("| all-on-all |") == 2
