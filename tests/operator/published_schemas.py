"""What the published APIs require of the objects moelora renders for routing, autoscaling and multi-node serving,
recorded from their sources (repository and path beside each), in a small JSON-Schema subset that
`schema_check.problems` reads: type, required, properties, additionalProperties (a schema for every value), items,
enum, minItems/maxItems, minimum/maximum, minLength/maxLength, pattern.

Only what the rendered objects touch is recorded; fields left out are not checked. None of these CRDs is installed
here: these facts stand in for the API server's validation.
"""

from __future__ import annotations

from typing import Any

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KIND = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
OBJECT_NAME = {"type": "string", "minLength": 1, "maxLength": 253}

# kubernetes-sigs/gateway-api-inference-extension: api/v1/inferencepool_types.go (v1 release line: endpointPickerRef
# with port.number, required when the referent is a Service) and
# config/crd/bases/inference.networking.k8s.io_inferencepools.yaml (selector.matchLabels, targetPorts 1..1 items).
INFERENCE_POOL: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"enum": ["inference.networking.k8s.io/v1"]},
        "kind": {"enum": ["InferencePool"]},
        "spec": {
            "type": "object",
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
                        }
                    },
                },
                "targetPorts": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": {"type": "object", "required": ["number"], "properties": {"number": PORT}},
                },
                "endpointPickerRef": {
                    "type": "object",
                    # port: required by the CRD's rule when kind is Service (the only kind moelora renders).
                    "required": ["name", "port"],
                    "properties": {
                        "group": {"type": "string", "maxLength": 253, "pattern": GROUP},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": KIND},
                        "name": OBJECT_NAME,
                        "port": {"type": "object", "required": ["number"], "properties": {"number": PORT}},
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                },
            },
        },
    },
}

# kubernetes-sigs/gateway-api: config/crd/standard/gateway.networking.k8s.io_httproutes.yaml, v1 (apis/v1/
# httproute_types.go, shared_types.go): parentRefs <= 32, rules <= 16, matches <= 64, headers <= 16 per match,
# backendRefs <= 16; a header match needs name and value, its type is Exact or RegularExpression.
_PARENT_REF = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "group": {"type": "string", "maxLength": 253, "pattern": GROUP},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": KIND},
        "name": OBJECT_NAME,
        "namespace": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": DNS_LABEL},
        "sectionName": {"type": "string", "minLength": 1, "maxLength": 253},
    },
}
_HEADER_MATCH = {
    "type": "object",
    "required": ["name", "value"],
    "properties": {
        "type": {"enum": ["Exact", "RegularExpression"]},
        "name": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$"},
        "value": {"type": "string", "minLength": 1, "maxLength": 4096},
    },
}
_MATCH = {"type": "object", "properties": {"headers": {"type": "array", "maxItems": 16, "items": _HEADER_MATCH}}}
_BACKEND_REF = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "group": {"type": "string", "maxLength": 253, "pattern": GROUP},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": KIND},
        "name": OBJECT_NAME,
        "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
    },
}
HTTP_ROUTE: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"enum": ["gateway.networking.k8s.io/v1"]},
        "kind": {"enum": ["HTTPRoute"]},
        "spec": {
            "type": "object",
            "properties": {
                "parentRefs": {"type": "array", "maxItems": 32, "items": _PARENT_REF},
                "rules": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {
                        "type": "object",
                        "properties": {
                            "matches": {
                                "type": "array",
                                "maxItems": 64,
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "headers": {"type": "array", "maxItems": 16, "items": _HEADER_MATCH}
                                    },
                                },
                            },
                            "backendRefs": {"type": "array", "maxItems": 16, "items": _BACKEND_REF},
                        },
                    },
                },
            },
        },
    },
}

# kubernetes/api: autoscaling/v2/types.go (HorizontalPodAutoscalerSpec, MetricSpec, MetricTarget). The built-in
# schema is also checked whole by kubernetes-validate; these are the parts moelora relies on.
HORIZONTAL_POD_AUTOSCALER: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"enum": ["autoscaling/v2"]},
        "kind": {"enum": ["HorizontalPodAutoscaler"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "maxReplicas"],
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["kind", "name"]},
                "minReplicas": {"type": "integer", "minimum": 1},
                "maxReplicas": {"type": "integer", "minimum": 1},
                "metrics": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {
                            "type": {"enum": ["ContainerResource", "External", "Object", "Pods", "Resource"]},
                            "pods": {
                                "type": "object",
                                "required": ["metric", "target"],
                                "properties": {
                                    "metric": {"type": "object", "required": ["name"]},
                                    "target": {
                                        "type": "object",
                                        "required": ["type"],
                                        "properties": {"type": {"enum": ["Utilization", "Value", "AverageValue"]}},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

# kedacore/keda: apis/keda/v1alpha1/scaledobject_types.go (spec.scaleTargetRef and spec.triggers required; a trigger
# needs type and metadata, a map of strings) and keda.sh docs, scalers/prometheus (serverAddress, query and
# threshold required).
SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"enum": ["keda.sh/v1alpha1"]},
        "kind": {"enum": ["ScaledObject"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": OBJECT_NAME},
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string", "minLength": 1},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUS_TRIGGER_REQUIRED = ("serverAddress", "query", "threshold")

# kubernetes-sigs/lws: api/leaderworkerset/v1/leaderworkerset_types.go (spec.leaderWorkerTemplate and its
# workerTemplate required; size is the group's pod count, at least 1; the enums below). The pod templates are
# checked with kubernetes-validate as PodTemplates.
LEADER_WORKER_SET: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"enum": ["leaderworkerset.x-k8s.io/v1"]},
        "kind": {"enum": ["LeaderWorkerSet"]},
        "spec": {
            "type": "object",
            "required": ["leaderWorkerTemplate"],
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "required": ["workerTemplate"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart", "None"]},
                        "leaderTemplate": {"type": "object"},
                        "workerTemplate": {"type": "object"},
                    },
                },
            },
        },
    },
}

# The contracts between the pieces, by name.
# kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go: WorkerIndexLabelKey, "0" on the leader.
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# kubernetes-sigs/lws site docs (reference: labels, annotations and environment variables): the leader's address.
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
# kubernetes-sigs/gateway-api-inference-extension pkg/bbr/README.md: the header body-based routing writes.
BBR_MODEL_HEADER = "X-Gateway-Model-Name"
# gateway-api-inference-extension api/v1 EndpointPickerRef and its chart: the picker's default gRPC port.
EPP_DEFAULT_PORT = 9002
