"""Bounded schemas of the Kubernetes pod objects a ModelServer passes through (security contexts, topology spread
constraints): like scheduling.py's, they keep the fields people use, with maxima, so a ModelServer always fits under
Kubernetes' annotation limit together with kopf's and kubectl's copies of its spec (tests/api/test_max_sizes.py).
"""

from __future__ import annotations

from typing import Any

from moelora.api.scheduling import LABEL_KEY, LABEL_SELECTOR, describe

_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_ID = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}


def _string(max_length: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


def _enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def _profile(*types: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"type": _enum(*types), "localhostProfile": _string(253)}}


_SE_LINUX = {"type": "object", "properties": {key: _string(64) for key in ("level", "role", "type", "user")}}
_COMMON = {
    "runAsUser": _ID,
    "runAsGroup": _ID,
    "runAsNonRoot": {"type": "boolean"},
    "seLinuxOptions": _SE_LINUX,
    "seccompProfile": _profile("RuntimeDefault", "Localhost", "Unconfined"),
    "appArmorProfile": _profile("RuntimeDefault", "Localhost", "Unconfined"),
}
_POD_SECURITY_CONTEXT: dict[str, Any] = {
    "type": "object",
    "properties": {
        **_COMMON,
        "fsGroup": _ID,
        "fsGroupChangePolicy": _enum("OnRootMismatch", "Always"),
        "supplementalGroups": {"type": "array", "maxItems": 16, "items": _ID},
        "supplementalGroupsPolicy": _enum("Merge", "Strict"),
        "sysctls": {
            "type": "array",
            "maxItems": 8,
            "items": {
                "type": "object",
                "required": ["name", "value"],
                "properties": {"name": _string(253), "value": _string(253)},
            },
        },
    },
}
_SECURITY_CONTEXT: dict[str, Any] = {
    "type": "object",
    "properties": {
        **_COMMON,
        "allowPrivilegeEscalation": {"type": "boolean"},
        "privileged": {"type": "boolean"},
        "readOnlyRootFilesystem": {"type": "boolean"},
        "procMount": _enum("Default", "Unmasked"),
        "capabilities": {
            "type": "object",
            "properties": {
                "add": {"type": "array", "maxItems": 8, "items": _string(64)},
                "drop": {"type": "array", "maxItems": 8, "items": _string(64)},
            },
        },
    },
}
_TOPOLOGY_SPREAD: dict[str, Any] = {
    "type": "object",
    "required": ["maxSkew", "topologyKey", "whenUnsatisfiable"],
    "properties": {
        "maxSkew": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        "topologyKey": _string(LABEL_KEY),
        "whenUnsatisfiable": _enum("DoNotSchedule", "ScheduleAnyway"),
        "labelSelector": LABEL_SELECTOR,
        "minDomains": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        "nodeAffinityPolicy": _enum("Honor", "Ignore"),
        "nodeTaintsPolicy": _enum("Honor", "Ignore"),
        "matchLabelKeys": {"type": "array", "maxItems": 4, "items": _string(LABEL_KEY)},
    },
}

# What `kubectl explain` says of each field: Kubernetes' own meaning, in short.
_DESCRIPTIONS = {
    "runAsUser": "The uid the processes run as.",
    "runAsGroup": "The primary gid the processes run as.",
    "runAsNonRoot": "Refuse to start a process as uid 0.",
    "seLinuxOptions": "The SELinux context applied.",
    "level": "SELinux level label.",
    "role": "SELinux role label.",
    "type": "The profile's or label's type.",
    "user": "SELinux user label.",
    "seccompProfile": "The seccomp profile (RuntimeDefault, Localhost or Unconfined).",
    "appArmorProfile": "The AppArmor profile (RuntimeDefault, Localhost or Unconfined).",
    "localhostProfile": "The profile's file on the node, for type Localhost.",
    "fsGroup": "The gid that owns the pod's volumes.",
    "fsGroupChangePolicy": "When volumes are re-owned to fsGroup: OnRootMismatch or Always.",
    "supplementalGroups": "More gids the processes belong to.",
    "supplementalGroupsPolicy": "How supplementalGroups combine with the image's groups: Merge or Strict.",
    "sysctls": "Namespaced sysctls set for the pod.",
    "name": "The sysctl's name.",
    "value": "The sysctl's value.",
    "allowPrivilegeEscalation": "Whether a process may gain more privileges than its parent.",
    "privileged": "Run as privileged (refused: the restricted profile forbids it).",
    "readOnlyRootFilesystem": "Mount the container's root filesystem read-only.",
    "procMount": "The /proc mount type: Default or Unmasked.",
    "capabilities": "Linux capabilities added or dropped.",
    "add": "Capabilities added.",
    "drop": "Capabilities dropped.",
    "maxSkew": "How unevenly the pods may be spread across the topology's domains.",
    "topologyKey": "The node label whose values are the domains (e.g. kubernetes.io/hostname).",
    "whenUnsatisfiable": "What to do when the spread cannot be kept: DoNotSchedule or ScheduleAnyway.",
    "labelSelector": "Which pods are counted; default: this server's pods.",
    "minDomains": "The fewest domains to spread over (DoNotSchedule only).",
    "nodeAffinityPolicy": "Whether the pods' node affinity limits the domains counted: Honor or Ignore.",
    "nodeTaintsPolicy": "Whether node taints limit the domains counted: Honor or Ignore.",
    "matchLabelKeys": "Pod label keys whose values further select the pods counted.",
}


POD_SECURITY_CONTEXT = describe(_POD_SECURITY_CONTEXT, _DESCRIPTIONS)
SECURITY_CONTEXT = describe(_SECURITY_CONTEXT, _DESCRIPTIONS)
TOPOLOGY_SPREAD = describe(_TOPOLOGY_SPREAD, _DESCRIPTIONS, "How to spread the pods over one topology.")
