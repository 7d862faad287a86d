"""An adapter's roll-up, pure: the operator's share of a LoRAAdapter's status, judged from the per-pod states its
server's agents write (status.py), and the Event its phase transition makes (kube/events.py records it).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from moelora.api import FailureReason
from moelora.operator.decide import status


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """A LoRAAdapter as stored, with what its phase is judged from."""

    body: Mapping[str, Any]
    server_exists: bool
    pods: Mapping[str, bool]  # the server's pods -> ready
    refused: str | None = None  # why policy refuses its source (SourceNotAllowed)


def named_pods(body: Mapping[str, Any]) -> set[str]:
    """The pods whose agents have an entry in the adapter's status."""
    return set((body.get("status") or {}).get("replicas") or {})


def render_status_patch(observation: Observation, *, now: datetime.datetime) -> dict[str, Any]:
    """The merge patch of the operator's share of the status; empty when nothing changes."""
    meta, spec = observation.body["metadata"], observation.body.get("spec") or {}
    return status.adapter_status_patch(
        dict(observation.body.get("status") or {}),
        served_name=spec.get("servedName") or meta["name"],
        generation=meta.get("generation"),
        server_exists=observation.server_exists,
        pods=observation.pods,
        now=now,
        refused=observation.refused,
        assigned=((observation.body.get("status") or {}).get("placement") or {}).get("replicas"),
    )


@dataclasses.dataclass(frozen=True)
class Emission:
    """An Event to record: Normal or Warning, with its reason and message."""

    type: str
    reason: str
    message: str


def _failed_reason(status: Mapping[str, Any]) -> str | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            return str(condition.get("reason"))
    return None


def _refusal(status: Mapping[str, Any]) -> str | None:
    """The refused version and why, from a Ready condition with reason UpdateRejected (status.py words it "<pod>
    serves <v1> and refused <v2>: <error>"): a pod or a replica count more is the same refusal."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("reason") == FailureReason.UPDATE_REJECTED.value:
            return str(condition.get("message") or "").split(" and refused ", 1)[-1]
    return None


def _ready_message(status: Mapping[str, Any]) -> str:
    messages = [c.get("message") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return str(messages[0] if messages and messages[0] else FailureReason.UPDATE_REJECTED.value)


def adapter_transition(old: Mapping[str, Any], patch: Mapping[str, Any]) -> Emission | None:
    """The Event of one status write of the roll-up (`old` the stored status, `patch` the merge patch written):
    Loaded when it becomes Loaded, a Warning named by the failure reason when it becomes Failed or fails for
    another reason, a Warning UpdateRejected when a new version is refused while the last good one keeps serving,
    Unloaded when a Loaded adapter stops being loaded everywhere; None otherwise."""
    new = {**old, **patch}
    before, after = old.get("phase"), new.get("phase")
    refusal = _refusal(new)
    if after == "Loaded" and refusal is not None and refusal != _refusal(old):
        return Emission("Warning", FailureReason.UPDATE_REJECTED.value, _ready_message(new))
    if after == "Failed":
        reason = _failed_reason(new) or "Failed"
        if before == "Failed" and _failed_reason(old) == reason:
            return None
        messages = [c.get("message") for c in new.get("conditions") or [] if c.get("type") == "Failed"]
        return Emission("Warning", reason, str(messages[0] if messages and messages[0] else reason))
    if after == before:
        return None
    if after == "Loaded":
        return Emission(
            "Normal", "Loaded", f"loaded on {new.get('loadedReplicas', 0)}/{new.get('desiredReplicas', 0)} replicas"
        )
    if before == "Loaded":
        ready = [c.get("message") for c in new.get("conditions") or [] if c.get("type") == "Ready"]
        why = ready[0] if ready and ready[0] else f"loaded on {new.get('loadedReplicas', 0)} replicas"
        return Emission("Normal", "Unloaded", f"no longer loaded on every ready replica ({after}: {why})")
    return None


DELETED = Emission("Normal", "Deleted", "the LoRAAdapter was deleted: its server's agents unload it")
