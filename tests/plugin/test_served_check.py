"""benchmarks/vllm_e2e/served_check.py against a stand-in OpenAI server on loopback (answers made up from the model
name and prompt, in vLLM's completions format with token ids as `token_id:N`), and its comparison of two servers'
answers: the same answers agree, an adapter answered with another's or logprobs beyond the bound do not."""

from __future__ import annotations

import http.server
import json
import pathlib
import sys
import threading
from collections.abc import Iterator

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks" / "vllm_e2e"))
import served_check  # noqa: E402


class Completions(http.server.BaseHTTPRequestHandler):
    bodies: list[dict] = []
    shift: dict[str, float] = {}  # per model, added to every logprob (a server whose numbers differ)

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        seed = sum(body["prompt"]) + sum(map(ord, body["model"]))
        tokens = [(seed * (i + 7)) % 1000 for i in range(body["max_tokens"])]
        lift = type(self).shift.get(body["model"], 0.0)
        logprobs = {
            "tokens": [f"token_id:{t}" for t in tokens],
            "token_logprobs": [-1.0 + lift for _ in tokens],
            "top_logprobs": [{f"token_id:{t}": -1.0 + lift, f"token_id:{t + 1}": -2.5 + lift} for t in tokens],
        }
        answer = json.dumps({"choices": [{"text": "", "logprobs": logprobs}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 64  # a burst of concurrent requests, as uvicorn's backlog takes them


@pytest.fixture
def server() -> Iterator[str]:
    Completions.bodies, Completions.shift = [], {}
    httpd = Server(("127.0.0.1", 0), Completions)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join(10)


def saved(answers: dict, path: pathlib.Path) -> dict:
    path.write_text(json.dumps(answers))  # as `collect` writes them: keys of the tops become strings
    return json.loads(path.read_text())


def test_collect_asks_every_model_greedy_with_token_ids(server, tmp_path):
    answers = served_check.collect(server, ["base", "lora1"], vocab=500, long=(60, 90))
    per_model = len(served_check.prompts(500, (60, 90))[0]) + served_check.BURST
    assert {m: len(a) for m, a in answers.items()} == {"base": per_model, "lora1": per_model}
    assert len(Completions.bodies) == 2 * per_model
    first = Completions.bodies[0]
    assert first["temperature"] == 0 and first["return_tokens_as_token_ids"] is True and first["logprobs"] > 0
    lengths = sorted({len(b["prompt"]) for b in Completions.bodies})
    assert lengths == [served_check.SHORT, 60, 90] and all(
        100 <= t < 500 for b in Completions.bodies for t in b["prompt"]
    )
    one = answers["lora1"][0]
    assert len(one["tokens"]) == served_check.MAX_TOKENS and all(isinstance(t, int) for t in one["tokens"])
    assert one["top"][0][one["tokens"][0]] == -1.0


def test_the_same_answers_agree_and_a_swapped_adapter_does_not(server, tmp_path):
    a = saved(served_check.collect(server, ["base", "lora1", "lora2"], vocab=500, long=(30,)), tmp_path / "a.json")
    lines, ok = served_check.compare(a, a, bound=0.1)
    assert ok and "| lora1 | 1.00 / 1.00 / 0.0000 |" in "\n".join(lines)
    swapped = dict(a, lora1=a["lora2"])  # a server that answered lora1's requests with lora2
    lines, ok = served_check.compare(a, swapped, bound=0.1)
    assert not ok and any(line.startswith("| lora1 | 0.00 / 0.00 /") for line in lines)


def test_logprobs_beyond_the_bound_fail_the_comparison(server, tmp_path):
    a = saved(served_check.collect(server, ["base", "lora1"], vocab=500, long=(30,)), tmp_path / "a.json")
    Completions.shift = {"lora1": 0.05}
    b = saved(served_check.collect(server, ["base", "lora1"], vocab=500, long=(30,)), tmp_path / "b.json")
    assert served_check.compare(a, b, bound=0.1)[1]
    assert not served_check.compare(a, b, bound=0.01)[1]
    assert served_check.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--bound", "0.01"]) == 1


def test_flat_logprobs_make_the_comparison_inconclusive(server, tmp_path):
    a = saved(served_check.collect(server, ["base", "lora1"], vocab=500, long=(30,)), tmp_path / "a.json")
    assert served_check.compare(a, a, bound=0.1)[1]
    for answers in a.values():  # as vLLM's dummy weights answer: every listed token about equally likely
        for answer in answers:
            answer["top"] = [{t: -12.2114 - 1e-6 * i for i, t in enumerate(top)} for top in answer["top"]]
    lines, ok = served_check.compare(a, a, bound=0.1)
    assert not ok and "inconclusive: at 100% of one model's positions" in "\n".join(lines)
