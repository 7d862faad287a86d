"""The Service in front of a ModelServer's pods: vLLM's OpenAI port, and the agent's metrics."""

from __future__ import annotations

from typing import Any

from moelora.api.agent_env import AGENT_PORT, VLLM_PORT
from moelora.operator.render import naming


def service(*, name: str, namespace: str, selector: dict[str, str] | None = None) -> dict[str, Any]:
    """`selector`: the pods that answer requests; default every pod of the server."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": naming.service_labels(name)},
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector) if selector is not None else naming.selector(name),
            "ports": [
                {"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "agent-metrics", "port": AGENT_PORT, "targetPort": "agent", "protocol": "TCP"},
            ],
        },
    }
