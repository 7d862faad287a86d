"""Replicas that disagree (issue 17): a bad new version is refused (UpdateRejected) on a replica that keeps serving
the last good one, while a brand-new replica, which never had the good version, reports the adapter Failed with the
specific reason. Both agents run their real loop (vLLM faked in memory, moto S3); their entries are then rolled up
by the operator's own function, which must show what each replica serves and not claim Loaded."""

from __future__ import annotations

import datetime
import pathlib
import threading

from moelora.agent.check.validate import AdapterInfo
from moelora.api import ReplicaAdapterState
from moelora.operator.decide import status as operator_status

from .conftest import KEYS, MemoryDesired, adapter_files, eventually, upload
from .test_faults_loop import FakeVllm, Loop

OLD, NEW = "srv-0", "srv-1"


class ReplicaKube:
    """The status.replicas map of each adapter, written by several agents (one per pod)."""

    def __init__(self) -> None:
        self.secrets = {"tenant": dict(KEYS)}
        self.replicas: dict[str, dict[str, ReplicaAdapterState]] = {}
        self.lock = threading.Lock()

    def read_secret(self, *, name: str) -> dict[str, str] | None:
        return self.secrets.get(name)

    def patch_replica(self, *, name: str, pod: str, state: ReplicaAdapterState, info: AdapterInfo | None) -> bool:
        with self.lock:
            self.replicas.setdefault(name, {})[pod] = state
        return True

    def create_pod_event(self, *, pod: str, pod_uid: str, reason: str, message: str, type: str = "Warning") -> None:
        pass

    def entry(self, name: str, pod: str) -> ReplicaAdapterState | None:
        with self.lock:
            return self.replicas.get(name, {}).get(pod)


def test_a_brand_new_replica_reports_a_refused_version_failed_while_older_ones_serve_the_last_good(
    s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    kube, desired = ReplicaKube(), MemoryDesired()
    desired.synced.set()
    upload(s3_env, bucket, "a/", adapter_files(seed=1))
    old_vllm, new_vllm = FakeVllm(), FakeVllm()
    old = Loop(tmp_path / "old", old_vllm, kube, desired, pod_name=OLD, resync_seconds=0.5)  # type: ignore[arg-type]
    desired.put("a", {"source": {"uri": f"s3://{bucket}/a/"}})
    eventually(lambda: (e := kube.entry("a", OLD)) is not None and e.loaded)
    good = kube.entry("a", OLD).version  # type: ignore[union-attr]

    upload(s3_env, bucket, "a/", adapter_files(rank=64, seed=2))  # the rollout: a version over the max rank
    eventually(lambda: kube.entry("a", OLD).rejected_version is not None)  # type: ignore[union-attr]
    new = Loop(tmp_path / "new", new_vllm, kube, desired, pod_name=NEW, resync_seconds=0.5)  # type: ignore[arg-type]
    desired.on_change = lambda: (old.agent.wake.set(), new.agent.wake.set())  # type: ignore[assignment]
    eventually(lambda: (e := kube.entry("a", NEW)) is not None and e.state.value == "Failed", timeout=30)
    try:
        serving, refusing = kube.entry("a", OLD), kube.entry("a", NEW)
        assert serving is not None and refusing is not None
        assert (serving.loaded, serving.version, serving.reason) == (True, good, "UpdateRejected")
        assert serving.rejected_version not in (None, good) and old_vllm.served  # the old pod still serves
        # The new pod never had the good version: nothing to fall back on, so Failed with the specific reason.
        assert (refusing.loaded, refusing.version, refusing.reason) == (False, None, "RankTooHigh")
        assert not new_vllm.served

        raw = {"replicas": {pod: state.to_wire() for pod, state in kube.replicas["a"].items()}}
        patch = operator_status.adapter_status_patch(
            raw,
            served_name="a",
            generation=1,
            server_exists=True,
            pods={OLD: True, NEW: True},
            now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        )
        conditions = {c["type"]: c for c in patch["conditions"]}
        assert patch["phase"] == "Failed" and conditions["Ready"]["status"] == "False"
        assert (patch["loadedReplicas"], patch["desiredReplicas"]) == (1, 2)
        message = conditions["Failed"]["message"]
        assert conditions["Failed"]["reason"] == "RankTooHigh" and message.startswith(f"{NEW}: ")
        # Per-replica truth: which version the other replica still serves, and what it refused.
        assert f"{OLD} serves {good}" in message and f"refused {serving.rejected_version}" in message
    finally:
        new.stop()
        old.stop()
