"""Where each pod gets the weights itself (no spec.model.cache): the disk it may use for them, and the env vLLM's
S3 streamer needs. Pure functions of the spec.

The disk is bounded only when spec.model.sizeHint says how big the weights are: the operator does not guess a size
from a model's name, so without the hint the download volume has no sizeLimit and the pod no ephemeral-storage
request (the kubelet may then evict a pod whose node runs out of disk).
"""

from __future__ import annotations

from typing import Any

from moelora.api import LoadFormat, ModelServerSpec
from moelora.operator.render import engine, security

EPHEMERAL_STORAGE = "ephemeral-storage"


def downloads(spec: ModelServerSpec) -> bool:
    """Whether every pod downloads the weights itself onto its own disk (hf:// or s3://, no cache, no streamer)."""
    model = engine.model_ref(spec)
    return spec.model.cache is None and model.scheme in ("hf", "s3") and spec.model.load_format == LoadFormat.AUTO


def download_volume(spec: ModelServerSpec) -> dict[str, Any]:
    """The emptyDir source of the volume the weights are downloaded into: bounded by the size hint when given."""
    return {"sizeLimit": spec.model.size_hint} if downloads(spec) and spec.model.size_hint else {}


def with_disk_bounds(pod_spec: dict[str, Any], spec: ModelServerSpec, *, server_container: str) -> dict[str, Any]:
    """`pod_spec` (already secured) with the size hint applied: the hub's download lands in vLLM's $HOME volume,
    so that one gets the sizeLimit for hf://; the server container requests the hint as ephemeral-storage, so the
    scheduler picks a node with the disk, unless the spec's resources already say how much."""
    if not downloads(spec) or not spec.model.size_hint:
        return pod_spec
    hint = spec.model.size_hint
    if engine.model_ref(spec).scheme == "hf":
        for volume in pod_spec.get("volumes", []):
            if volume["name"] == security.HOME_VOLUME:
                volume["emptyDir"] = {**volume.get("emptyDir", {}), "sizeLimit": hint}
    for container in pod_spec["containers"]:
        if container["name"] != server_container:
            continue
        resources = container.setdefault("resources", {})
        requests = resources.setdefault("requests", {})
        if EPHEMERAL_STORAGE not in requests and EPHEMERAL_STORAGE not in resources.get("limits", {}):
            requests[EPHEMERAL_STORAGE] = hint
    return pod_spec


def streamer_env(spec: ModelServerSpec) -> list[dict[str, Any]]:
    """What vLLM's runai_streamer reads besides the AWS_* of the pod: the S3 endpoint under its own names."""
    if spec.model.load_format != LoadFormat.STREAMER or not spec.s3.endpoint_url:
        return []
    return [
        {"name": "AWS_ENDPOINT_URL", "value": spec.s3.endpoint_url},
        {"name": "RUNAI_STREAMER_S3_ENDPOINT", "value": spec.s3.endpoint_url},
    ]
