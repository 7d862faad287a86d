"""The pod's scheduling and identity knobs a ModelServer may set: its own labels and annotations, image pull
Secrets, priority, topology spread and ServiceAccount. The labels and annotations moelora sets itself are refused,
so a user can never move a pod out of its Deployment's selector or fake a rollout hash."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from moelora.api import ModelServerSpec
from moelora.operator.errors import SpecProblem
from moelora.operator.render import naming
from moelora.operator.settings import Settings

RESERVED_ANNOTATION_PREFIX = "moelora.io/"
# Added by the Deployment controller to every pod of a ReplicaSet.
_CONTROLLER_LABELS = {"pod-template-hash"}
_WHEN_UNSATISFIABLE = {"DoNotSchedule", "ScheduleAnyway"}


def check(spec: ModelServerSpec, *, name: str) -> None:
    """Raise SpecProblem for pod labels or annotations that are moelora's, or an unusable topology spread."""
    reserved = set(naming.labels(name)) | _CONTROLLER_LABELS
    for key in spec.pod_labels:
        if key in reserved:
            raise SpecProblem("ReservedPodLabel", f"podLabels may not set {key}: moelora sets it (pod selector)")
    for key in spec.pod_annotations:
        if key.startswith(RESERVED_ANNOTATION_PREFIX):
            raise SpecProblem("ReservedPodAnnotation", f"podAnnotations may not set {key}: moelora.io/ is moelora's")
    for index, constraint in enumerate(spec.topology_spread_constraints):
        where = f"spec.topologySpreadConstraints[{index}]"
        if not isinstance(constraint.get("topologyKey"), str) or not constraint["topologyKey"]:
            raise SpecProblem("InvalidTopologySpread", f"{where}: topologyKey is required")
        skew = constraint.get("maxSkew")
        if isinstance(skew, bool) or not isinstance(skew, int) or skew < 1:
            raise SpecProblem("InvalidTopologySpread", f"{where}: maxSkew must be an integer of at least 1")
        if constraint.get("whenUnsatisfiable") not in _WHEN_UNSATISFIABLE:
            raise SpecProblem(
                "InvalidTopologySpread", f"{where}: whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway"
            )


def template_metadata(
    spec: ModelServerSpec, *, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, Any]:
    """The pod template's metadata: the user's labels and annotations, then moelora's (checked not to clash)."""
    metadata: dict[str, Any] = {"labels": {**spec.pod_labels, **labels}}
    if spec.pod_annotations or annotations:
        metadata["annotations"] = {**spec.pod_annotations, **annotations}
    return metadata


def pod_fields(spec: ModelServerSpec, *, name: str, settings: Settings) -> dict[str, Any]:
    """Pod spec fields: ServiceAccount, image pull Secrets, priority class, topology spread constraints."""
    fields: dict[str, Any] = {"serviceAccountName": spec.service_account_name or settings.server_service_account}
    if spec.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": ref.name} for ref in spec.image_pull_secrets]
    if spec.priority_class_name:
        fields["priorityClassName"] = spec.priority_class_name
    if spec.topology_spread_constraints:
        constraints = []
        for constraint in spec.topology_spread_constraints:
            constraint = copy.deepcopy(constraint)
            # Without a selector a constraint counts no pods and spreads nothing: count this server's pods.
            constraint.setdefault("labelSelector", {"matchLabels": naming.selector(name)})
            constraints.append(constraint)
        fields["topologySpreadConstraints"] = constraints
    return fields
