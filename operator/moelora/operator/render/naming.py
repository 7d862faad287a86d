"""Names and labels of the objects a ModelServer owns; one place, so the pod, Service and indexes agree."""

from __future__ import annotations

from moelora.operator.render.engine import VLLM_PORT

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_SERVER = "moelora.io/model-server"  # the selector
LABEL_COMPONENT = "app.kubernetes.io/component"
# The client Service's component: the chart's ServiceMonitor selects only it, so each pod is scraped once however
# many other Services (the headless one of placement) select the same pods.
API_COMPONENT = "api"
MANAGED_BY = "moelora"
APP_NAME = "moelora-server"

ANNOTATION_HASH = "moelora.io/desired-hash"  # on each owned object: the hash of what the operator last rendered
ANNOTATION_KERNEL_CONFIGS = "moelora.io/kernel-configs-hash"  # on the pod template: new configs roll the pods


def labels(name: str) -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVER: name}


def service_labels(name: str) -> dict[str, str]:
    """The labels of the client Service (the one the ServiceMonitor scrapes through)."""
    return {**labels(name), LABEL_COMPONENT: API_COMPONENT}


def selector(name: str) -> dict[str, str]:
    return {LABEL_SERVER: name}


def selector_string(name: str) -> str:
    return ",".join(f"{key}={value}" for key, value in selector(name).items())


def pod_name(name: str, ordinal: int) -> str:
    """A placed server's pod: its StatefulSet carries the server's name, and the controller names pods by ordinal."""
    return f"{name}-{ordinal}"


def endpoint(name: str, namespace: str) -> str:
    """The OpenAI-compatible base URL inside the cluster."""
    return f"http://{name}.{namespace}.svc:{VLLM_PORT}/v1"
