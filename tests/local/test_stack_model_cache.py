"""The model cache in the local stack without vLLM (no replicas): the operator's fill Job runs the agent's real
`fetch-model` into the claim's folder, once, and only then is the Deployment rendered."""

from __future__ import annotations

import pathlib
import time
from typing import Any

from moelora.local import manifests, s3, stack


def _cache(local: stack.Stack, name: str) -> dict[str, Any]:
    return (((local.model_server(name) or {}).get("status") or {}).get("modelCache")) or {}


def test_the_fill_job_downloads_each_object_once_into_the_claim(tmp_path: pathlib.Path) -> None:
    with stack.Stack(root=tmp_path) as local, s3.RequestLog() as requests:
        server = manifests.model_server(name="cached", s3_endpoint=local.s3.endpoint_url, replicas=0)  # type: ignore[union-attr]
        server["spec"]["model"]["cache"] = {"size": "1Gi"}
        local.apply(server)
        deadline = time.monotonic() + 60
        while _cache(local, "cached").get("phase") != "Ready" and time.monotonic() < deadline:
            time.sleep(0.2)
        cache = _cache(local, "cached")
        assert cache.get("phase") == "Ready", cache
        deployment = local.read("/apis/apps/v1/namespaces/default/deployments/cached")
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["models"]["persistentVolumeClaim"]["claimName"] == cache["claimName"]
        time.sleep(1.5)  # more kubelet and operator rounds: nothing is fetched again
        folder = tmp_path / "pods" / "claims" / cache["claimName"]
        files = sorted(p.relative_to(local.model_dir).as_posix() for p in local.model_dir.rglob("*") if p.is_file())
        for name in files:
            assert (folder / name).read_bytes() == (local.model_dir / name).read_bytes()
    prefix = "/" + manifests.MODEL_URI.removeprefix("s3://")
    gets = [path.removeprefix(prefix) for path in requests.gets]
    assert sorted(gets) == files
