from __future__ import annotations

from moelora.operator.render import naming
from moelora.operator.render.deployment import deployment
from moelora.operator.render.disruption import disruption_budget

from .conftest import k8s_valid, make_spec


def test_one_replica_gets_no_budget() -> None:
    # maxUnavailable 1 of 1 would allow the eviction anyway; 0 would block the node's drain: neither helps.
    assert disruption_budget(make_spec(replicas=1), name="m", namespace="n") is None
    assert disruption_budget(make_spec(replicas=0), name="m", namespace="n") is None


def test_replicas_leave_one_at_a_time_and_the_budget_selects_exactly_the_servers_pods(settings) -> None:
    spec = make_spec(replicas=4)
    budget = disruption_budget(spec, name="m", namespace="n")
    assert budget is not None
    k8s_valid(budget)
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    pod_labels = deployment(spec, name="m", namespace="n", settings=settings)["spec"]["template"]["metadata"]["labels"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    # Another server's pods carry another value of the selecting label.
    assert selector != naming.selector("other")
