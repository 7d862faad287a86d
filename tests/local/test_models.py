"""The generated model and adapters are what vLLM and peft expect, and the adapters really change the output."""

from __future__ import annotations

import json
import pathlib

from safetensors import safe_open

from moelora.local import models

from .conftest import BASE_MODEL_NAME


def test_model_dir_has_what_vllm_loads(tiny: dict[str, pathlib.Path]) -> None:
    names = {p.name for p in tiny["model"].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((tiny["model"] / "config.json").read_text())
    assert config["hidden_size"] == 256 and config["num_hidden_layers"] == 2
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_adapter_is_safetensors_peft_with_given_base_and_rank(tiny: dict[str, pathlib.Path]) -> None:
    assert sorted(p.name for p in tiny["a2"].iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tiny["a2"] / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == BASE_MODEL_NAME
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert set(config["target_modules"]) == set(models.DEFAULT_TARGET_MODULES)
    with safe_open(str(tiny["a2"] / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
        b_key = next(k for k in keys if "lora_B" in k)
        assert f.get_tensor(b_key).abs().sum() > 0  # not peft's all-zero init
        a_key = next(k for k in keys if "lora_A" in k)
        assert f.get_tensor(a_key).shape[0] == 4


def test_generation_is_deterministic(tmp_path: pathlib.Path, tiny: dict[str, pathlib.Path]) -> None:
    again = models.make_model(path=tmp_path / "model")
    assert (again / "model.safetensors").read_bytes() == (tiny["model"] / "model.safetensors").read_bytes()


def test_adapters_change_the_reference_completion(tiny: dict[str, pathlib.Path]) -> None:
    base, a1, a2 = models.reference_completions(
        model_dir=tiny["model"], adapter_dirs=[None, tiny["a1"], tiny["a2"]], prompt="hello world", max_tokens=8
    )
    assert len(base.token_ids) == 8  # greedy on random weights does not hit eos this early
    assert len({base.token_ids, a1.token_ids, a2.token_ids}) == 3
    assert (
        models.reference_completion(model_dir=tiny["model"], adapter_dir=tiny["a1"], prompt="hello world", max_tokens=8)
        == a1
    )
