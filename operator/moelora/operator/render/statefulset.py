"""The StatefulSet a ModelServer with `spec.placement` runs as, and the headless Service that names its pods.

Placement hashes adapters onto replicas by name, so a replica's name must outlive its process: a StatefulSet's
pods are `<ms>-0 .. <ms>-(N-1)` across restarts, rescheduling and scaling (a Deployment's random names would make
every restarted pod a stranger and reshuffle its adapters). The pod template is the Deployment's, unchanged but
for the agent's `MOELORA_PLACEMENT`, which makes it serve only the adapters assigned to its pod.
"""

from __future__ import annotations

import copy
from typing import Any

from moelora.api.agent_env import AgentEnv
from moelora.operator.render import naming
from moelora.operator.render.deployment import AGENT_CONTAINER
from moelora.operator.render.engine import VLLM_PORT

HEADLESS_COMPONENT = "pod-dns"  # not naming.API_COMPONENT: the ServiceMonitor must not scrape its pods again


def headless_service_name(name: str) -> str:
    return f"{name}-pods"


def statefulset(deployment: dict[str, Any], *, replicas: int) -> dict[str, Any]:
    """The Deployment rendered for the server, as a StatefulSet of `replicas` pods (spec.replicas, or more while
    a scale-down drains: a pod leaves only once its adapters are loaded elsewhere)."""
    name = deployment["metadata"]["name"]
    template = copy.deepcopy(deployment["spec"]["template"])
    for container in template["spec"]["containers"]:
        if container["name"] == AGENT_CONTAINER:
            container["env"] = [*container.get("env", []), AgentEnv.entry("placement", True)]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": copy.deepcopy(deployment["metadata"]),
        "spec": {
            "replicas": replicas,
            "serviceName": headless_service_name(name),
            # Pods start and stop together, as a Deployment's do: an ordinal waiting on another's model load
            # would make scaling N times slower, and no pod needs another's data to start.
            "podManagementPolicy": "Parallel",
            "selector": copy.deepcopy(deployment["spec"]["selector"]),
            "template": template,
        },
    }


def headless_service(*, name: str, namespace: str) -> dict[str, Any]:
    """DNS names per pod (`<ms>-0.<ms>-pods.<ns>.svc`), so a client or gateway can reach the pod holding an
    adapter; notReady pods are published too, so a pod's name resolves while it loads."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": headless_service_name(name),
            "namespace": namespace,
            "labels": {**naming.labels(name), naming.LABEL_COMPONENT: HEADLESS_COMPONENT},
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": naming.selector(name),
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
