"""Routing through an inference gateway: the server's InferencePool, its HTTPRoute, and the ConfigMaps that tell the
gateway's body-based router which model names the server serves.

The body-based router (BBR) reads each request's `model` and sets the header `X-Gateway-Base-Model-Name` to the base
model that serves it: the base model's own name maps to itself, each adapter's name to its base model, any other
name to "". It learns the mapping from ConfigMaps labelled `inference.networking.k8s.io/bbr-managed: "true"`, each
holding `baseModel` (a name) and `adapters` (a YAML list of names). So the HTTPRoute matches that header once, against
the server's base model, however many adapters it serves: one match per ModelServer, far within the Gateway API's
128 matches per route. The endpoint picker then chooses the pod within the pool.

Each adapter's name has a ConfigMap of its own, owned by its LoRAAdapter. BBR keeps one map from names to base models
for all its ConfigMaps, and deletes a name from it whenever any ConfigMap stops listing it, even one that another
ConfigMap still lists. A name moved from one ConfigMap to another is thus unmapped for a while in one order of the
two writes, and for good in the other; within its own ConfigMap an adapter's route changes in one write.

With routeToHome, a pod's adapters are routed straight to it: their ConfigMaps name the header value
`<base>@<pod>`, and a route per 16 pods matches each such value to a Service of that pod alone.
"""

from __future__ import annotations

import hashlib
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
HOME_SEPARATOR = "@"
ROUTE_SUFFIX = "-route"
ROUTE_COMPONENT = "route"  # app.kubernetes.io/component of the adapters' ConfigMaps
HOME_COMPONENT = "home"  # of the per-pod Services and their routes, which the operator lists to prune
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"  # the StatefulSet controller sets it on each pod
MAX_RULES = 16  # the HTTPRoute CRD's maxItems on spec.rules
MAX_NAME = 253  # a ConfigMap's name: a DNS subdomain
MAX_LABEL = 63  # a Service's name: a DNS label


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


def model_names_config_map(spec: ModelServerSpec, *, name: str, namespace: str) -> dict[str, Any]:
    """The ConfigMap that maps the base model's served name to itself (each adapter's name has its own)."""
    meta = {
        "name": model_names_config_map_name(name),
        "namespace": namespace,
        "labels": {**naming.labels(name), BBR_MANAGED_LABEL: "true"},
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {BASE_MODEL_KEY: engine.served_model_name(spec, name=name)},
    }


def home_header(base: str, pod: str) -> str:
    """The header value that routes to one pod alone."""
    return f"{base}{HOME_SEPARATOR}{pod}"


def route_config_map_name(adapter: str) -> str:
    """The adapter's own ConfigMap: its name with a suffix, shortened with a hash where that would pass 253."""
    name = f"{adapter}{ROUTE_SUFFIX}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.blake2b(adapter.encode(), digest_size=4).hexdigest()
    return f"{adapter[: MAX_NAME - len(ROUTE_SUFFIX) - 9].rstrip('.-')}-{digest}{ROUTE_SUFFIX}"


def route_config_map(*, adapter: str, served: str, namespace: str, server: str, header: str) -> dict[str, Any]:
    """The ConfigMap BBR reads for one adapter: its served name maps to `header` (its server's base model, or
    `home_header` for its home pod). Carries no ownerReference: the LoRAAdapter's is added by who writes it."""
    meta = {
        "name": route_config_map_name(adapter),
        "namespace": namespace,
        "labels": {**naming.labels(server), BBR_MANAGED_LABEL: "true", naming.LABEL_COMPONENT: ROUTE_COMPONENT},
    }
    data = {BASE_MODEL_KEY: header, ADAPTERS_KEY: yaml.safe_dump([served], default_flow_style=False, width=1 << 20)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def home_service_name(name: str, ordinal: int) -> str:
    return f"{name}-home-{ordinal}"


def home_route_name(name: str, chunk: int) -> str:
    return f"{name}-homes-{chunk}"


def check_home_names(*, name: str, pods: int) -> None:
    """Raises SpecProblem when the last pod's Service name would pass a DNS label's 63 characters."""
    longest = home_service_name(name, max(pods - 1, 0))
    if len(longest) > MAX_LABEL:
        raise SpecProblem(
            "NameTooLongForHomes",
            f"routeToHome names a Service per pod, up to {longest!r} ({len(longest)} characters), over the "
            f"{MAX_LABEL} a Service name may have: shorten the ModelServer's name",
        )


def home_services(*, name: str, namespace: str, pods: int) -> list[dict[str, Any]]:
    """A Service per pod of a placed server, selecting that pod alone (its StatefulSet's pod-name label)."""
    labels = {**naming.labels(name), naming.LABEL_COMPONENT: HOME_COMPONENT}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": home_service_name(name, ordinal), "namespace": namespace, "labels": labels},
            "spec": {
                "selector": {**naming.selector(name), POD_NAME_LABEL: naming.pod_name(name, ordinal)},
                "ports": [{"name": "http", "port": engine.VLLM_PORT, "targetPort": engine.VLLM_PORT}],
            },
        }
        for ordinal in range(pods)
    ]


def home_routes(spec: ModelServerSpec, *, name: str, namespace: str, pods: int) -> list[dict[str, Any]]:
    """Routes matching each pod's header value to its Service, 16 pods a route (the HTTPRoute CRD's most rules)."""
    base = engine.served_model_name(spec, name=name)
    parents = [ref.to_wire() for ref in spec.routing.gateway.parent_refs]
    rules = [
        {
            "matches": [{"headers": [_header(home_header(base, naming.pod_name(name, ordinal)))]}],
            "backendRefs": [{"name": home_service_name(name, ordinal), "port": engine.VLLM_PORT}],
        }
        for ordinal in range(pods)
    ]
    labels = {**naming.labels(name), naming.LABEL_COMPONENT: HOME_COMPONENT}
    return [
        {
            "apiVersion": ROUTE_API_VERSION,
            "kind": "HTTPRoute",
            "metadata": {"name": home_route_name(name, chunk), "namespace": namespace, "labels": labels},
            "spec": {"parentRefs": parents, "rules": rules[start : start + MAX_RULES]},
        }
        for chunk, start in enumerate(range(0, len(rules), MAX_RULES))
    ]


def _header(value: str) -> dict[str, str]:
    return {"type": "Exact", "name": BASE_MODEL_HEADER, "value": value}


def http_route(spec: ModelServerSpec, *, name: str, namespace: str) -> dict[str, Any]:
    """One route per server: a request BBR found to be for this server's base model (the base model itself or one
    of its adapters) goes to the pool."""
    match = {"headers": [_header(engine.served_model_name(spec, name=name))]}
    backend = {"group": POOL_GROUP, "kind": "InferencePool", "name": name}
    parents = [ref.to_wire() for ref in spec.routing.gateway.parent_refs]
    return {
        "apiVersion": ROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.labels(name)},
        "spec": {"parentRefs": parents, "rules": [{"matches": [match], "backendRefs": [backend]}]},
    }
