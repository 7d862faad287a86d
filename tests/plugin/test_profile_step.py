"""benchmarks/vllm_e2e/profile_step.py on a made-up torch-profiler trace: kernels are counted in the step whose mark
precedes their launch, decode steps are averaged, and each step with prompt tokens gets its own row."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks" / "vllm_e2e"))
import profile_step  # noqa: E402


class Trace:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.correlation = 0

    def step(self, label: str, ts: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": label, "ts": ts, "dur": 1})

    def kernel(
        self, name: str, launched: float, start: float, dur: float, stream: int = 7, grid: list | None = None
    ) -> None:
        self.correlation += 1
        args = {"correlation": self.correlation}
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launched, "args": args})
        kernel_args = {**args, "stream": stream, **({} if grid is None else {"grid": grid})}
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": dur, "args": kernel_args})


def made_up() -> Trace:
    trace = Trace()
    # A prefill step: 2 prompts of 1600 tokens beside 14 decodes, LoRA on a second stream beside the base MoE.
    trace.step("execute_context_2(3200)_generation_14(14)", 0)
    trace.kernel("fused_moe_kernel", 1, 10, 4000)
    trace.kernel("_shrink_kernel", 2, 20, 1000, stream=9)  # beside the base MoE for all its 1000 µs
    trace.kernel("_dense_splitk_kernel", 3, 4100, 500, stream=9)  # alone
    trace.kernel("flash_attn_fwd", 4, 4700, 300)
    # Two decode steps of the same shape.
    for t0 in (10_000, 20_000):
        trace.step("execute_context_0(0)_generation_16(16)", t0)
        trace.kernel("fused_moe_kernel", t0 + 1, t0 + 10, 100)
        trace.kernel("_expand_kernel", t0 + 2, t0 + 120, 40, stream=9)
    return trace


def test_prefill_steps_get_a_row_with_their_lora_time(tmp_path, capsys):
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": made_up().events}))
    assert profile_step.main([str(path), "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["decode_steps"] == 2 and out["by_cat"]["MoE-LoRA (moelora)"] == 40
    (row,) = out["prefill"]
    assert (row["prompts"], row["prompt_tokens"], row["decodes"], row["kernels"]) == (2, 3200, 14, 4)
    ms = {k: row[k] for k in ("lora_ms", "moe_lora_ms", "lora_beside_ms", "base MoE GEMMs", "attention", "dense GEMMs")}
    assert ms == pytest.approx(
        {
            "lora_ms": 1.5,
            "moe_lora_ms": 1.0,
            "lora_beside_ms": 1.0,
            "base MoE GEMMs": 4.0,
            "attention": 0.3,
            "dense GEMMs": 0,
        }
    )
    assert (row["span_ms"], row["busy_ms"]) == pytest.approx((4.99, 4.8))  # 10..4010, 4100..4600, 4700..5000
    printed = capsys.readouterr().out
    assert "| 2 (3200) + 14 | 4 | 4.99 | 4.80 | 1.50 | 1.00 | 1.00 | 4.00 | 0.30 | 0.00 |" in printed


def test_main_stream_gaps_go_to_the_side_kernel_that_ended_last_in_them(tmp_path, capsys):
    trace = Trace()
    for t0, grid in ((10_000, [648, 1, 1]), (20_000, [288, 1, 1])):  # one kernel, two layers' shapes
        trace.step("execute_context_0(0)_generation_16(16)", t0)
        trace.kernel("nvjet_qkv", t0 + 1, t0 + 10, 8)  # main 10..18
        trace.kernel("_route_finish_kernel", t0 + 2, t0 + 10, 4, stream=9)  # ends 14, while the main stream is busy
        trace.kernel("_dense_splitk_kernel", t0 + 3, t0 + 14, 16, stream=9, grid=grid)  # ends 30, in the gap 18..33
        trace.kernel("flash_attn_fwd", t0 + 4, t0 + 33, 20)  # main 33..53
        trace.kernel("fused_moe_kernel", t0 + 5, t0 + 60, 100)  # main 60..160: a gap of 7 where nothing ended
        trace.kernel("_expand_kernel", t0 + 6, t0 + 70, 50, stream=9)  # ends 120, beside the base MoE
        trace.kernel("_shrink_kernel", t0 + 7, t0 + 121, 60, stream=9)  # ends 181, inside the gap 160..185
        trace.kernel("triton_poi_fused_0", t0 + 8, t0 + 150, 15, stream=11)  # ends 165: in the gap, not last
        trace.kernel("act_and_mul_kernel", t0 + 9, t0 + 185, 5)  # main 185..190
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": trace.events}))
    assert profile_step.main([str(path), "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["waits"] == pytest.approx(
        {"dense LoRA (moelora split K)": 15, "MoE-LoRA (moelora)": 25, profile_step.NO_WAIT: 7}
    )
    split = {"_dense_splitk_kernel [648, 1, 1]": 7.5, "_dense_splitk_kernel [288, 1, 1]": 7.5}  # a step each
    assert out["waits_by_name"] == pytest.approx({**split, "_shrink_kernel": 25})
    printed = capsys.readouterr().out
    assert "(47 in all)" in printed and "| MoE-LoRA (moelora) | 25 |" in printed
