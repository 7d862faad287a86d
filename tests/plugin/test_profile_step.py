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

    def kernel(self, name: str, launched: float, start: float, dur: float, stream: int = 7) -> None:
        self.correlation += 1
        args = {"correlation": self.correlation}
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launched, "args": args})
        kernel_args = {**args, "stream": stream}
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
