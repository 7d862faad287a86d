"""Routing through an inference gateway: the server's InferencePool and its HTTPRoute.

The gateway's endpoint picker (EPP) chooses the pod for each request; its LoRA affinity scorer reads each pod's
`vllm:lora_requests_info`, so a request for an adapter goes to a pod that has it loaded (all of them, or the subset
placement gave it) without a route per pod. The HTTPRoute only says which model names this pool serves: body-based
routing copies the request's `model` into the X-Gateway-Model-Name header, and the route matches it exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from moelora.api import ModelServerSpec
from moelora.operator import engine, naming
from moelora.operator.errors import SpecProblem

POOL_API_VERSION = "inference.networking.k8s.io/v1"
POOL_GROUP = "inference.networking.k8s.io"
ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
MODEL_HEADER = "X-Gateway-Model-Name"  # written by the extension's body-based router

# HTTPRoute limits: matches in a rule are ORed; a route holds at most this many rules of this many matches.
MAX_MATCHES_PER_RULE = 64
MAX_RULES = 16


def epp_service_name(spec: ModelServerSpec, *, name: str) -> str:
    return spec.routing.gateway.endpoint_picker.service_name or f"{name}-epp"


def inference_pool(spec: ModelServerSpec, *, name: str, namespace: str, selector: dict[str, str]) -> dict[str, Any]:
    """The pool of the server's serving pods (`selector`: every replica's pod, or each group's leader) on vLLM's
    port, with the endpoint picker the gateway consults."""
    picker = spec.routing.gateway.endpoint_picker
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name)},
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "targetPorts": [{"number": engine.VLLM_PORT}],
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": epp_service_name(spec, name=name),
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode,
            },
        },
    }


def model_names(spec: ModelServerSpec, *, name: str, adapters: Iterable[str]) -> list[str]:
    """The base model's served name first, then each adapter's, without repeats."""
    names = [engine.served_model_name(spec, name=name)]
    for adapter in sorted(adapters):
        if adapter not in names:
            names.append(adapter)
    return names


def http_route(spec: ModelServerSpec, *, name: str, namespace: str, adapters: Iterable[str]) -> dict[str, Any]:
    """One route per server: a request whose model is the base model or one of its adapters goes to the pool.
    Raises SpecProblem when the names exceed what one HTTPRoute can hold."""
    names = model_names(spec, name=name, adapters=adapters)
    if len(names) > MAX_MATCHES_PER_RULE * MAX_RULES:
        raise SpecProblem(
            "TooManyModelNames",
            f"{len(names)} model names exceed the {MAX_MATCHES_PER_RULE * MAX_RULES} one HTTPRoute can match",
        )
    backend = {"group": POOL_GROUP, "kind": "InferencePool", "name": name}
    rules = [
        {
            "matches": [
                {"headers": [{"type": "Exact", "name": MODEL_HEADER, "value": model}]}
                for model in names[start : start + MAX_MATCHES_PER_RULE]
            ],
            "backendRefs": [dict(backend)],
        }
        for start in range(0, len(names), MAX_MATCHES_PER_RULE)
    ]
    parents = [ref.to_wire() for ref in spec.routing.gateway.parent_refs]
    return {
        "apiVersion": ROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name)},
        "spec": {"parentRefs": parents, "rules": rules},
    }
