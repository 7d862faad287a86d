"""The scale check of benchmarks/cluster_costs.py, smaller: the operator (its own process) gets no event of pods
that are not a server's, a server pod event costs O(1) API calls, its RSS stays small, and one agent sees at most
two events per adapter state (its own report and the operator's roll-up of it), none of another server's adapters.
benchmarks/operator_scale.py --adapters 1000 --unrelated-pods 10000 runs it at full size (docs/benchmarks.md).

Every count below is exact, not a budget that a bigger cluster would strain, so a small cluster shows growth as well
as a big one; both of these fail this test at its size: a pod watch without its label selector (201 pods listed, 230
events for 30), and reading each of the server's adapters on a pod event (17.6 calls per event)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))

from cluster_costs import Costs, measure  # noqa: E402

pytestmark = pytest.mark.slow


def test_costs_do_not_grow_with_the_cluster() -> None:
    costs = measure(Costs(adapters=20, unrelated_pods=200, other_adapters=20), timeout=120)
    assert costs.pods_listed == 1 and costs.deployments_listed == 0  # only the server's own pod
    assert costs.pod_watch_events == costs.server_pod_events  # none of the unrelated pods' writes
    assert costs.calls_per_pod_event <= 1
    assert costs.agent_watch_events <= costs.agent_bound  # and none of the other server's 20 x 2 reports
    assert costs.peak_rss_mib < 300
    assert costs.errors == []
