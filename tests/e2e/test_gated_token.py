"""A gated model's Hugging Face token, from a Secret, reaches vLLM's environment in the rendered pod (run by the local
kubelet under the restricted security defaults) and nowhere else: not the Deployment, the Pod, the status, the Events,
nor any log. Its own one-replica stack, so it needs none of the shared session's servers."""

from __future__ import annotations

import base64
import json
import pathlib

import pytest

from moelora.local import manifests, stack

pytestmark = pytest.mark.slow

TOKEN = "hf_e2eGATEDtokenMustNeverLeak0001"


def test_token_reaches_vllm_and_nothing_else(tmp_path: pathlib.Path) -> None:
    with stack.Stack(root=tmp_path / "stack") as local:
        local.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "hf-token"},
                "type": "Opaque",
                "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
            }
        )
        server = manifests.model_server(name="gated", s3_endpoint=local.s3.endpoint_url)  # type: ignore[union-attr]
        server["spec"]["model"]["tokenSecret"] = {"name": "hf-token", "key": "token"}
        local.apply(server)
        [pod] = local.wait_pods("gated", replicas=1, timeout=400)

        vllm = pod.containers["vllm"].process
        assert vllm is not None
        environ = pathlib.Path(f"/proc/{vllm.pid}/environ").read_bytes().split(b"\0")
        assert f"HF_TOKEN={TOKEN}".encode() in environ
        agent = pod.containers["agent"].process
        assert agent is not None
        assert TOKEN.encode() not in pathlib.Path(f"/proc/{agent.pid}/environ").read_bytes()

        deployment = local.get("deployment", "gated")
        assert deployment is not None
        vllm_spec = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
        assert vllm_spec["securityContext"]["runAsNonRoot"] is True
        seen = json.dumps(
            [
                deployment,
                local.get("pod", pod.name),
                local.model_server("gated"),
                local.read("/api/v1/namespaces/default/events"),
            ]
        )
        logs = [path.read_text(errors="replace") for path in local.root.rglob("*.log")]
        assert logs and TOKEN not in seen
        assert not [text[:200] for text in logs if TOKEN in text]
