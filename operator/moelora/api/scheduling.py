"""Bounded schemas of the Kubernetes scheduling objects a ModelServer passes to its pods (Toleration, Affinity), and
the size limits of names and values the models share.

Free-form objects have no largest size, but a ModelServer must fit under Kubernetes' 256 KiB limit of annotations
together with kopf's copy of its spec (the last-handled configuration) and kubectl's: every field needs a maximum,
and these sum up to what tests/api/test_max_sizes.py checks. The schemas keep the fields people use; anything else
is pruned by the API server, as for any structural schema.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import JsonDict

LABEL_KEY = 317  # a qualified name: a DNS-subdomain prefix (253), '/', a name (63)
LABEL_VALUE = 63
KEY_RULE_MAP: JsonDict = {  # a map whose keys are label keys / resource names
    "x-kubernetes-validations": [
        {"rule": f"self.all(k, k.size() <= {LABEL_KEY})", "message": f"keys are at most {LABEL_KEY} characters"}
    ]
}


def _string(max_length: int, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length, **extra}


def _strings(max_items: int, max_length: int) -> dict[str, Any]:
    return {"type": "array", "maxItems": max_items, "items": _string(max_length)}


def _requirement(operators: list[str], max_values: int) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["key", "operator"],
        "properties": {
            "key": _string(LABEL_KEY),
            "operator": {"type": "string", "enum": operators},
            "values": _strings(max_values, LABEL_VALUE),
        },
    }


_NODE_REQUIREMENT = _requirement(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"], 4)
_NODE_TERM = {
    "type": "object",
    "properties": {
        "matchExpressions": {"type": "array", "maxItems": 4, "items": _NODE_REQUIREMENT},
        "matchFields": {"type": "array", "maxItems": 1, "items": _NODE_REQUIREMENT},
    },
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {
            "type": "object",
            "maxProperties": 2,
            "additionalProperties": _string(LABEL_VALUE),
            **KEY_RULE_MAP,
        },
        "matchExpressions": {
            "type": "array",
            "maxItems": 2,
            "items": _requirement(["In", "NotIn", "Exists", "DoesNotExist"], 4),
        },
    },
}
_POD_TERM = {
    "type": "object",
    "required": ["topologyKey"],
    "properties": {
        "labelSelector": _LABEL_SELECTOR,
        "namespaces": _strings(2, LABEL_VALUE),
        "topologyKey": _string(LABEL_KEY),
    },
}
_WEIGHT = {"type": "integer", "minimum": 1, "maximum": 100}


def _pod_affinity() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"type": "array", "maxItems": 1, "items": _POD_TERM},
            "preferredDuringSchedulingIgnoredDuringExecution": {
                "type": "array",
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "required": ["weight", "podAffinityTerm"],
                    "properties": {"weight": _WEIGHT, "podAffinityTerm": _POD_TERM},
                },
            },
        },
    }


_AFFINITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "nodeAffinity": {
            "type": "object",
            "properties": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "type": "object",
                    "required": ["nodeSelectorTerms"],
                    "properties": {"nodeSelectorTerms": {"type": "array", "maxItems": 2, "items": _NODE_TERM}},
                },
                "preferredDuringSchedulingIgnoredDuringExecution": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "required": ["weight", "preference"],
                        "properties": {"weight": _WEIGHT, "preference": _NODE_TERM},
                    },
                },
            },
        },
        "podAffinity": _pod_affinity(),
        "podAntiAffinity": _pod_affinity(),
    },
}

_TOLERATION: dict[str, Any] = {
    "type": "object",
    "properties": {
        "key": _string(LABEL_KEY),
        "operator": {"type": "string", "enum": ["Exists", "Equal"]},
        "value": _string(LABEL_VALUE),
        "effect": {"type": "string", "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
        "tolerationSeconds": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
    },
}

# What `kubectl explain` says of each field: Kubernetes' own meaning, in short.
_DESCRIPTIONS = {
    "key": "The label key (or taint key) the requirement is about.",
    "operator": "How the key and values are compared.",
    "values": "The values compared with (empty for Exists and DoesNotExist).",
    "value": "The taint value the toleration matches (Equal).",
    "effect": "The taint effect tolerated; empty: all.",
    "tolerationSeconds": "How long a NoExecute taint is tolerated before eviction; absent: forever.",
    "matchExpressions": "Requirements that must all hold.",
    "matchFields": "Requirements on the node's fields (metadata.name).",
    "matchLabels": "Labels that must all be present with these values.",
    "labelSelector": "Which pods the term is about.",
    "namespaces": "Namespaces of those pods; empty: the pod's own.",
    "topologyKey": "The node label whose equal values count as co-located (e.g. kubernetes.io/hostname).",
    "weight": "The preference's weight, 1-100.",
    "preference": "The node selector term preferred.",
    "podAffinityTerm": "The pod affinity term preferred.",
    "nodeSelectorTerms": "Node selector terms, any of which must hold.",
    "requiredDuringSchedulingIgnoredDuringExecution": "What must hold for the pod to be scheduled.",
    "preferredDuringSchedulingIgnoredDuringExecution": "What the scheduler prefers, by weight.",
    "nodeAffinity": "Which nodes the pods may or prefer to run on.",
    "podAffinity": "Pods these pods should run beside.",
    "podAntiAffinity": "Pods these pods should not run beside (e.g. each other, to spread replicas).",
}


def describe(node: dict[str, Any], descriptions: dict[str, str], description: str = "") -> dict[str, Any]:
    """A copy of the schema with every field described from `descriptions` by its name (items of arrays by their
    array's description); a node that has a description keeps it."""
    node = dict(node)
    if description and "description" not in node:
        node["description"] = description
    if "properties" in node:
        node["properties"] = {
            key: sub if "description" in sub else describe(sub, descriptions, descriptions[key])
            for key, sub in node["properties"].items()
        }
    if isinstance(node.get("items"), dict):
        node["items"] = describe(node["items"], descriptions, node.get("description", ""))
    return node


AFFINITY = describe(_AFFINITY, _DESCRIPTIONS)
TOLERATION = describe(_TOLERATION, _DESCRIPTIONS, "A taint the pods tolerate.")
LABEL_SELECTOR = describe(_LABEL_SELECTOR, _DESCRIPTIONS, "Which pods are counted; default: this server's pods.")
