"""An adapter's roll-up says when it is stale: the agents mark it Stale with each change of their own entry, the
operator's roll-up marks it Current. With the operator away, `kubectl get lora` shows Rollup=Stale beside a phase
that no longer follows the entries, instead of a phase that silently lies."""

from __future__ import annotations

import datetime
from typing import Any

from moelora.agent.report.kube import Kube
from moelora.api import ReplicaAdapterState
from moelora.operator.decide.status import adapter_status_patch

NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def judge(raw_status: dict[str, Any]) -> dict[str, Any]:
    return adapter_status_patch(
        raw_status, served_name="a", generation=1, server_exists=True, pods={"p": True}, now=NOW
    )


def test_an_agents_change_makes_the_rollup_stale_until_the_operator_rolls_it_up() -> None:
    class Custom:
        body: dict[str, Any] = {}

        def patch_namespaced_custom_object_status(self, *args: Any, **_: Any) -> None:
            Custom.body = args[-1]

    kube = Kube.__new__(Kube)
    kube.namespace, kube.custom = "ns", Custom()
    kube.patch_replica(name="a", pod="p", state=ReplicaAdapterState(loaded=True, state="Loaded"), info=None)
    written = Custom.body["status"]
    assert written["rollup"] == "Stale" and written["replicas"]["p"]["observedAt"].endswith("Z")

    patch = judge(written)
    assert patch["rollup"] == "Current" and patch["phase"] == "Loaded"
    assert patch["rolledUpAt"] == "2026-01-02T03:04:05Z"
    assert judge({**written, **patch}) == {}  # nothing new: no write, and rolledUpAt stays


def test_a_stale_mark_alone_is_cleared_even_when_phase_and_counts_stay() -> None:
    settled = judge({"replicas": {"p": {"loaded": True, "state": "Loaded"}}})
    settled = {"replicas": {"p": {"loaded": True, "state": "Loaded"}}, **settled}
    assert judge({**settled, "rollup": "Stale"}) == {"rollup": "Current", "rolledUpAt": "2026-01-02T03:04:05Z"}
