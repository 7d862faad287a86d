"""The shared model cache in the local stack: two replicas serve the tiny model from one claim, filled by one Job,
and S3 served each of the model's objects exactly once (moto's request log is counted)."""

from __future__ import annotations

import logging
import pathlib
import re
from collections.abc import Iterator

import pytest

from moelora.local import manifests, stack, vllm_server

pytestmark = pytest.mark.slow

SERVER = "cached"
REPLICAS = 2
_OBJECT_GET = re.compile(r'"GET (/[^ ?]+) HTTP')


class _Requests(logging.Handler):
    """moto's werkzeug request lines, as they come."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def requests() -> Iterator[_Requests]:
    handler = _Requests()
    logger = logging.getLogger("werkzeug")
    yield handler
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, requests: _Requests) -> Iterator[stack.Stack]:
    with stack.Stack(root=tmp_path_factory.mktemp("cache-stack")) as running:
        # Counted from here: the stack's own upload of the model is not a download.
        logger = logging.getLogger("werkzeug")
        logger.setLevel(logging.INFO)
        logger.addHandler(requests)
        server = manifests.model_server(
            name=SERVER,
            s3_endpoint=running.s3.endpoint_url,  # type: ignore[union-attr]
            replicas=REPLICAS,
        )
        server["spec"]["model"]["cache"] = {"size": "1Gi"}
        running.apply(server)
        running.wait_pods(SERVER, replicas=REPLICAS, timeout=400)
        yield running


def test_two_replicas_serve_from_one_download(local: stack.Stack, requests: _Requests) -> None:
    status = local.model_server(SERVER)["status"]  # type: ignore[index]
    assert status["modelCache"]["phase"] == "Ready"
    claim = status["modelCache"]["claimName"]
    pods = local.kubelet.pods_of(SERVER)  # type: ignore[union-attr]
    assert len(pods) == REPLICAS
    for pod in pods:
        assert not pod.plan.init_containers  # nothing downloads in the pods
        assert pod.plan.volumes["models"] == local.root / "pods" / "claims" / claim
    for url in local.vllm_urls(SERVER):
        assert vllm_server.complete(url=url, model=SERVER, prompt="hello", max_tokens=2)

    prefix = "/" + manifests.MODEL_URI.removeprefix("s3://")
    gets: dict[str, int] = {}
    for line in requests.lines:
        match = _OBJECT_GET.search(line)
        if match and match.group(1).startswith(prefix):
            gets[match.group(1)] = gets.get(match.group(1), 0) + 1
    files = sorted(
        p.relative_to(local.model_dir).as_posix() for p in pathlib.Path(local.model_dir).rglob("*") if p.is_file()
    )
    assert sorted(key.removeprefix(prefix) for key in gets) == files
    assert set(gets.values()) == {1}, gets
