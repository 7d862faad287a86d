"""The PodDisruptionBudget of a ModelServer with two replicas or more.

Voluntary disruptions (node drains, cluster upgrades, autoscaler scale-downs) then take its pods one at a time, so
the Service keeps answering while an evicted replica loads its weights and adapters elsewhere. A single replica
gets no budget: one that allowed no eviction would block every drain of its node. Unhealthy pods may always be
evicted, so a replica stuck crash-looping never blocks a drain either.
"""

from __future__ import annotations

from typing import Any

from moelora.api import ModelServerSpec
from moelora.operator.render import naming


def disruption_budget(spec: ModelServerSpec, *, name: str, namespace: str) -> dict[str, Any] | None:
    if spec.replicas < 2:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name)},
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": naming.selector(name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
