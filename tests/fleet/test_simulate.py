"""The simulator's CLI on small cells: every layout runs, and placement keeps less on each pod."""

from __future__ import annotations

from fleet import simulate


def test_a_small_cell() -> None:
    args = simulate.parse(["--requests", "3000"])
    cells = simulate.cells(args, adapters=60, replicas=4)
    assert [cell.strategy for cell in cells] == list(simulate.LAYOUTS)
    assert {cell.stats.requests for cell in cells} == {2400}
    everywhere, _, placed, gpu_first = cells
    assert everywhere.disk_gb == everywhere.scale_gb == sum(simulate.adapter_sizes(args, 60))
    assert placed.disk_gb == gpu_first.disk_gb < everywhere.disk_gb
    assert 0 < placed.scale_moved < 0.5 and placed.short == 0
    assert len(simulate.verdicts(cells)) == 2 + 2 * 3


def test_main_prints_tables(capsys) -> None:
    simulate.main(["--adapters", "30", "--replicas", "2,3", "--requests", "500", "--target", "30,3"])
    out = capsys.readouterr().out
    assert out.count("placement, least-loaded holder") == 2 + 3 and "Targets at 30 adapters x 3 replicas" in out
