"""benchmarks/vllm_e2e/iterations.py on made-up vLLM per-step lines: decode steps and steps with prompt tokens are
told apart and each kind's time is summed."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks" / "vllm_e2e"))
import iterations  # noqa: E402


def line(i: int, ctx_reqs: int, ctx_tokens: int, gen: int, ms: float) -> str:
    return (
        f"(APIServer pid=1) INFO 12-05 04:45:{i % 60:02d} [loggers.py:199] "
        f"Iteration({i}): {ctx_reqs} context requests, "
        f"{ctx_tokens} context tokens, {gen} generation requests, {gen} generation tokens, "
        f"iteration elapsed time: {ms:.2f} ms, GPU KV cache usage: 3.0%"
    )


def test_decode_and_prefill_steps_are_split_and_summed(tmp_path, capsys):
    server = tmp_path / "gpt-oss-plugin"
    server.mkdir()
    lines = [line(0, 5, 8192, 0, 250.0), line(1, 5, 8000, 11, 240.0)]  # a first burst: two chunked prefill steps
    lines += [line(2 + i, 0, 0, 16, 4.5) for i in range(6)] + [line(8, 0, 0, 15, 4.0)]  # decodes, one batch smaller
    lines += [line(9, 1, 1600, 15, 60.0), "an unrelated line"]
    (server / "iterations.txt").write_text("\n".join(lines) + "\n")
    assert iterations.main([str(server), "--json", str(tmp_path / "out.json")]) == 0
    f = json.loads((tmp_path / "out.json").read_text())["gpt-oss-plugin"]
    assert (f["steps"], f["decode_steps"], f["prefill_steps"], f["decode_batch"]) == (10, 7, 3, 16)
    assert f["decode_median_ms"] == 4.5 and f["decode_batch_mean_ms"] == pytest.approx(4.5)
    assert f["prefill_median_ms"] == 240.0 and f["prefill_tokens_per_step"] == pytest.approx((8192 + 8000 + 1600) / 3)
    assert f["prefill_ms_per_1000_tokens"] == pytest.approx(1000 * 550 / 17792)
    total = 550 + 6 * 4.5 + 4.0
    assert (f["decode_share"], f["prefill_share"]) == pytest.approx((31 / total, 550 / total))
    assert "| gpt-oss-plugin | 10 | 7 | 4.50 | 16 | 4.50 | 3 | 240.0 |" in capsys.readouterr().out


def test_a_server_without_step_lines_is_named_and_fails(tmp_path, capsys):
    (tmp_path / "iterations.txt").write_text("")
    assert iterations.main([str(tmp_path)]) == 1
    assert "no per-step lines" in capsys.readouterr().err


def test_a_server_with_pass_marks_gets_a_row_per_pass(tmp_path):
    """pass_steps.txt (each pass's name and the steps logged by its end) splits one server's steps: a base-model
    pass's faster decodes are not averaged into the adapters' pass."""
    server = tmp_path / "gpt-oss-plugin"
    server.mkdir()
    lines = [line(i, 0, 0, 16, 5.0) for i in range(4)] + [line(4 + i, 0, 0, 16, 4.0) for i in range(3)]
    (server / "iterations.txt").write_text("\n".join(lines) + "\n")
    (server / "pass_steps.txt").write_text("pass1 4\npassbase 7\n")
    assert iterations.main([str(server), "--json", str(tmp_path / "out.json")]) == 0
    rows = json.loads((tmp_path / "out.json").read_text())
    assert set(rows) == {"gpt-oss-plugin pass1", "gpt-oss-plugin passbase"}
    decode = {name: (f["decode_steps"], f["decode_median_ms"]) for name, f in rows.items()}
    assert decode == {"gpt-oss-plugin pass1": (4, 5.0), "gpt-oss-plugin passbase": (3, 4.0)}
