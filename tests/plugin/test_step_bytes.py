"""benchmarks/vllm_e2e/step_bytes.py: the expected distinct experts match sampled routing, LoRA's bytes follow the
rank, and a collapsed router reads fewer expert weights than uniform routing while the LoRA's share grows."""

from __future__ import annotations

import pathlib
import random
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks" / "vllm_e2e"))
import step_bytes  # noqa: E402


@pytest.mark.parametrize(("draws", "choices"), [(64, 32), (128, 128), (8, 32), (16, 128)])
def test_distinct_matches_sampling(draws, choices):
    rng = random.Random(0)
    trials = 4000
    sampled = sum(len({rng.randrange(choices) for _ in range(draws)}) for _ in range(trials)) / trials
    assert step_bytes.distinct(draws, choices) == pytest.approx(sampled, rel=0.02)


@pytest.mark.parametrize("shape", [step_bytes.GPT_OSS, step_bytes.QWEN3])
def test_lora_weights_follow_the_rank_and_nothing_else_does(shape):
    r16 = step_bytes.step_bytes(shape, 16, 8, 16, 1900, None)
    r32 = step_bytes.step_bytes(shape, 16, 8, 32, 1900, None)
    assert r32["base"] == r16["base"]
    for part in ("MoE LoRA", "attention LoRA"):
        assert r32["lora"][part] == pytest.approx(2 * r16["lora"][part])
    for part in ("MoE LoRA activations", "attention LoRA activations"):
        assert r32["lora"][part] == r16["lora"][part] > 0


@pytest.mark.parametrize("shape", [step_bytes.GPT_OSS, step_bytes.QWEN3])
def test_int8_expert_lora_halves_its_weights_and_nothing_else(shape):
    bf16 = step_bytes.step_bytes(shape, 16, 8, 32, 1900, None)
    int8 = step_bytes.step_bytes(shape, 16, 8, 32, 1900, None, int8=True)
    assert int8["base"] == bf16["base"]
    # A byte a weight plus a float32 scale per rank of each projection: just over half.
    assert 0.5 < int8["lora"]["MoE LoRA"] / bf16["lora"]["MoE LoRA"] < 0.51
    assert {k: v for k, v in int8["lora"].items() if k != "MoE LoRA"} == {
        k: v for k, v in bf16["lora"].items() if k != "MoE LoRA"
    }


@pytest.mark.parametrize("shape", [step_bytes.GPT_OSS, step_bytes.QWEN3])
def test_a_prompt_beside_the_decodes_makes_the_lora_weigh_more(shape):
    decode = step_bytes.step_bytes(shape, 16, 8, 32, 1900, None)
    mixed = step_bytes.step_bytes(shape, 16, 8, 32, 1900, None, prompt=1600)
    share = {name: sum(r["lora"].values()) / sum(r["base"].values()) for name, r in [("d", decode), ("m", mixed)]}
    assert share["m"] > 2 * share["d"]
    # The prompt's adapter adds at most every expert it did not touch yet; the step reads every expert once.
    assert decode["pairs a layer"] < mixed["pairs a layer"] <= decode["pairs a layer"] + shape.experts
    assert mixed["experts a layer"] == pytest.approx(shape.experts, rel=1e-3)
    # At prefill the rows the LoRA moves again outweigh its weights.
    assert mixed["lora"]["MoE LoRA activations"] > mixed["lora"]["MoE LoRA"]


@pytest.mark.parametrize("shape", [step_bytes.GPT_OSS, step_bytes.QWEN3])
def test_a_collapsed_router_makes_the_lora_weigh_more(shape):
    uniform = step_bytes.step_bytes(shape, 16, 8, 32, 1900, None)
    collapsed = step_bytes.step_bytes(shape, 16, 8, 32, 1900, 4.6)
    assert collapsed["base"]["experts"] < uniform["base"]["experts"]
    share = {name: sum(r["lora"].values()) / sum(r["base"].values()) for name, r in [("u", uniform), ("c", collapsed)]}
    assert share["c"] > 2 * share["u"]
    # One adapter cannot reach more experts than its tokens' routed slots.
    assert collapsed["pairs a layer"] <= 8 * min(4.6, 2 * shape.top_k)


def test_table_prints_a_row_per_model_and_routing(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["step_bytes.py", "--experts", "4.6"])
    step_bytes.main()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 + 4
    assert any(line.startswith("| GPT-OSS-20B | uniform |") for line in out)
    assert any(line.startswith("| Qwen3-30B-A3B | 4.6 experts |") for line in out)
