"""Helpers of the tests that run the real kopf operator against the emulated API server, driven with kubectl.

The emulator has no Deployment controller and no kubelet: where a test needs a rollout or a ready pod, it writes
their status itself, as those controllers would.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

import yaml

from moelora.local import process
from moelora.local.apiserver import KubeAPI

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
MS = "moelora.io/v1alpha1/modelservers"
LORA = "moelora.io/v1alpha1/loraadapters"
DEPLOYMENTS = "apps/v1/deployments"
PDBS = "policy/v1/poddisruptionbudgets"

# Polls every 50 ms; 15 s is far beyond what the operator needs on this machine.
wait_for = functools.partial(process.wait_for, timeout=15)


def manifest(path: str, *, namespace: str, **spec: Any) -> dict[str, Any]:
    """An example from examples/, in `namespace`, with `spec` keys replaced."""
    obj = yaml.safe_load((EXAMPLES / path).read_text())
    obj["metadata"]["namespace"] = namespace
    obj["spec"].update(spec)
    return obj


def apply(kube: KubeAPI, obj: dict[str, Any], *, check: bool = True) -> Any:
    return kube.kubectl("apply", "-f", "-", stdin=json.dumps(obj), check=check)


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return cond
    return None


def server_pod(namespace: str, name: str = "qwen-moe-abc", server: str = "qwen-moe") -> dict[str, Any]:
    """A pod of the server as its Deployment would create it (not ready yet)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "moelora", "moelora.io/model-server": server},
        },
        "spec": {"containers": [{"name": "vllm", "image": "x"}]},
    }


def patch_status(kube: KubeAPI, kind: str, name: str, namespace: str, status: dict[str, Any]) -> None:
    """What a controller, the kubelet or an agent writes: a merge patch of the status subresource."""
    kube.kubectl(
        "patch",
        kind,
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def make_ready(kube: KubeAPI, namespace: str, name: str = "qwen-moe-abc") -> None:
    patch_status(kube, "pod", name, namespace, {"conditions": [{"type": "Ready", "status": "True"}]})
