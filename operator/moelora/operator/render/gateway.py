"""Routing through an inference gateway: the server's InferencePool, its HTTPRoute, and the ConfigMap that tells the
gateway's body-based router which model names the server serves.

The body-based router (BBR) reads each request's `model` and sets the header `X-Gateway-Base-Model-Name` to the base
model that serves it: the base model's own name maps to itself, each adapter's name to its base model, any other
name to "". It learns the mapping from ConfigMaps labelled `inference.networking.k8s.io/bbr-managed: "true"`, each
holding `baseModel` (a name) and `adapters` (a YAML list of names). So the HTTPRoute matches that header once, against
the server's base model, however many adapters it serves: one match per ModelServer, far within the Gateway API's
128 matches per route. The endpoint picker then chooses the pod within the pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from moelora.api import ModelServerSpec
from moelora.operator.errors import SpecProblem
from moelora.operator.render import engine, naming

POOL_API_VERSION = "inference.networking.k8s.io/v1"
POOL_GROUP = "inference.networking.k8s.io"
ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"

# The body-based router's contract, as its source states it: kubernetes-sigs/gateway-api-inference-extension
# cmd/bbr/runner (ConfigMaps watched only with this label, value "true") and pkg/bbr/plugins/basemodelextractor
# (the header it sets; the keys `baseModel` and `adapters`, a YAML list, in its adapters store), which
# llm-d/llm-d-inference-payload-processor pkg/plugins/basemodelextractor carries on unchanged since GIE v1.6.
BASE_MODEL_HEADER = "X-Gateway-Base-Model-Name"
BBR_MANAGED_LABEL = "inference.networking.k8s.io/bbr-managed"
BASE_MODEL_KEY = "baseModel"
ADAPTERS_KEY = "adapters"
MAX_CONFIG_MAP_BYTES = 1024 * 1024  # the API server refuses a ConfigMap whose keys and values pass 1 MiB


def epp_service_name(spec: ModelServerSpec, *, name: str) -> str:
    return spec.routing.gateway.endpoint_picker.service_name or f"{name}-epp"


def model_names_config_map_name(name: str) -> str:
    return f"{name}-model-names"


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


def adapter_names(spec: ModelServerSpec, *, name: str, adapters: Iterable[str]) -> list[str]:
    """The adapters' served names, sorted, without the base model's (which BBR already maps to itself)."""
    base = engine.served_model_name(spec, name=name)
    return sorted(set(adapters) - {base})


def model_names_config_map(
    spec: ModelServerSpec, *, name: str, namespace: str, adapters: Iterable[str]
) -> dict[str, Any]:
    """The ConfigMap BBR reads: the base model's served name and its adapters' (`adapters`: their served names).
    Raises SpecProblem when the names pass what one ConfigMap holds."""
    data = {BASE_MODEL_KEY: engine.served_model_name(spec, name=name)}
    names = adapter_names(spec, name=name, adapters=adapters)
    if names:  # BBR reads a missing `adapters` as none
        data[ADAPTERS_KEY] = yaml.safe_dump(names, default_flow_style=False, width=1 << 20)
    size = sum(len(key.encode()) + len(value.encode()) for key, value in data.items())
    if size > MAX_CONFIG_MAP_BYTES:
        raise SpecProblem(
            "TooManyModelNames",
            f"the names of {len(names)} adapters take {size} bytes, over the {MAX_CONFIG_MAP_BYTES} one ConfigMap "
            "holds for the body-based router",
        )
    meta = {
        "name": model_names_config_map_name(name),
        "namespace": namespace,
        "labels": {**naming.labels(name), BBR_MANAGED_LABEL: "true"},
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def http_route(spec: ModelServerSpec, *, name: str, namespace: str) -> dict[str, Any]:
    """One route per server: a request BBR found to be for this server's base model (the base model itself or one
    of its adapters) goes to the pool."""
    match = {
        "headers": [{"type": "Exact", "name": BASE_MODEL_HEADER, "value": engine.served_model_name(spec, name=name)}]
    }
    backend = {"group": POOL_GROUP, "kind": "InferencePool", "name": name}
    parents = [ref.to_wire() for ref in spec.routing.gateway.parent_refs]
    return {
        "apiVersion": ROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name)},
        "spec": {"parentRefs": parents, "rules": [{"matches": [match], "backendRefs": [backend]}]},
    }
