"""Issue 17's crash chaos of the agent: SIGKILLs of `python -m moelora.agent` while bytes flow, adapters created and
deleted between and during its runs; then (the drip lifted, the agent left to finish) no leftover in the cache and
every entry's files equal to the uploaded objects (sha256). The harness, and what "leftover" means exactly, are in
benchmarks/chaos_pods.py; `make chaos` runs the full size, the default run ten kills."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
import chaos_pods  # noqa: E402


def run_and_check(root: pathlib.Path, kills: int) -> None:
    report = chaos_pods.agent_kills(root=root, kills=kills, seed=17)
    print(report.table())
    assert report.kills == kills
    assert report.mid_download >= 0.9 * kills  # the kills landed while bytes flowed, not between downloads
    assert report.deleted_down >= kills // 4 and report.deleted_up >= kills // 6
    assert report.crashes == 0
    assert report.problems == []  # leftovers, digest mismatches, a load of a bad directory, an unsettled adapter
    assert report.live > 0 and report.entries >= report.live and report.loads >= report.live


@pytest.mark.slow
def test_ten_agent_kills_mid_download_leave_no_leftovers(tmp_path: pathlib.Path) -> None:
    run_and_check(tmp_path, 10)


@pytest.mark.slow
@pytest.mark.chaos
def test_a_hundred_agent_kills_mid_download_leave_no_leftovers(tmp_path: pathlib.Path) -> None:
    run_and_check(tmp_path, 100)


def test_an_agent_that_exits_on_its_own_is_reported_with_the_end_of_its_own_log(tmp_path: pathlib.Path) -> None:
    chaos = chaos_pods.AgentChaos(root=tmp_path)  # not entered: no server is started
    chaos.logs.mkdir(parents=True)
    chaos.port = 41234
    with open(chaos.logs / "41234.log", "wb") as log:
        code = "import sys; print('starting'); print('OSError: [Errno 98] Address already in use'); sys.exit(1)"
        chaos.agent = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
    chaos.agent.wait(timeout=30)
    (chaos.logs / "41235.log").write_text("another agent's line\n")
    respawned = []
    chaos.spawn = lambda: respawned.append(True)  # type: ignore[method-assign]
    chaos._alive()
    assert chaos.report.crashes == 1 and respawned == [True]
    (problem,) = chaos.report.problems
    assert problem.startswith("the agent exited with 1 on its own; its log ends:")
    assert "Address already in use" in problem and "another agent" not in problem
