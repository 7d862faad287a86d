"""Real adapters pass the tensor checks with the base model's dims: the local stack's (written by transformers and
peft) and the existing tests' own. A check that refused these would refuse every tenant."""

from __future__ import annotations

import importlib
import json
import pathlib
from typing import Any

import pytest

from moelora.agent.check import basemodel, safetensors_header
from moelora.agent.check.validate import Limits, validate
from moelora.agent.errors import AdapterError

from .conftest import BASE_MODEL, VLLM_BASE_NAME, adapter_files
from .hostile import LLAMA, adapter, base_config

MOE_BASE_NAME = "moelora/tiny-moe"


def limits(base: str, config: pathlib.Path) -> Limits:
    return Limits(base_model=base, max_rank=16, target_modules=frozenset(), max_bytes=1 << 30, base_config=config)


def test_the_local_stacks_dense_adapters_pass(tiny: dict[str, Any]) -> None:
    for name in ("v1", "v2"):
        info = validate(tiny[name], limits(VLLM_BASE_NAME, tiny["model"] / "config.json"))
        assert info.rank == 8 and info.target_modules == ("q_proj", "v_proj")


@pytest.fixture(scope="module")
def moe_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """The local stack's tiny Qwen3-MoE and an adapter in both layouts (imported by name: the module may move)."""
    moe = importlib.import_module("moelora.local.moe")
    root = tmp_path_factory.mktemp("moe")
    model = moe.make_moe_model(path=root / "model")
    vllm_layout = moe.make_moe_adapter(
        model_dir=model, path=root / "vllm", peft_path=root / "peft", base_model_name=MOE_BASE_NAME
    )
    return {"model": model, "vllm": vllm_layout, "peft": root / "peft"}


@pytest.mark.parametrize("layout", ["vllm", "peft"])
def test_the_local_stacks_moe_adapters_pass(moe_adapters: dict[str, pathlib.Path], layout: str) -> None:
    info = validate(moe_adapters[layout], limits(MOE_BASE_NAME, moe_adapters["model"] / "config.json"))
    assert info.rank == 8


def test_the_existing_tests_adapters_pass(tmp_path: pathlib.Path) -> None:
    config = base_config(tmp_path / "base", LLAMA)
    for modules in (["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj"]):
        directory = tmp_path / "-".join(modules)
        for relpath, data in adapter_files(modules=modules).items():
            (directory / relpath).parent.mkdir(parents=True, exist_ok=True)
            (directory / relpath).write_bytes(data)
        assert validate(directory, limits(BASE_MODEL, config)).rank == 8


def test_a_peft_gpt_oss_adapter_with_fused_experts_passes(tmp_path: pathlib.Path) -> None:
    """GPT-OSS stores its experts transposed, (E, in, out); peft reads them so, and so must the checks."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["full_attention", "full_attention"],
    )
    torch.manual_seed(0)
    model = GptOssForCausalLM(config)
    model.save_pretrained(str(tmp_path / "base"), safe_serialization=True)
    lora = peft.LoraConfig(
        r=4,
        target_modules=["q_proj", "o_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    peft.get_peft_model(model, lora).save_pretrained(str(tmp_path / "adapter"), safe_serialization=True)
    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = "openai/tiny-gpt-oss"
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(adapter_config))
    (tmp_path / "adapter" / "README.md").unlink(missing_ok=True)
    header = safetensors_header.read(tmp_path / "adapter" / "adapter_model.safetensors")
    assert any(".mlp.experts.base_layer.lora_A" in name for name in header.tensors)
    info = validate(tmp_path / "adapter", limits("openai/tiny-gpt-oss", tmp_path / "base" / "config.json"))
    assert info.rank == 4
    assert basemodel.load(tmp_path / "base" / "config.json").model_type == "gpt_oss"


def test_a_tenants_refused_adapter_next_to_a_good_one(tmp_path: pathlib.Path) -> None:
    """One bad adapter changes nothing for the next: the checks keep no state between adapters."""
    config = base_config(tmp_path / "base", LLAMA)
    good = adapter(tmp_path / "good", weights=b"", adapter_config=b"{}")
    for relpath, data in adapter_files().items():
        (good / relpath).write_bytes(data)
    bad = adapter(tmp_path / "bad", weights=b"\x80\x04junk", adapter_config=(good / "adapter_config.json").read_bytes())
    with pytest.raises(AdapterError):
        validate(bad, limits(BASE_MODEL, config))
    assert validate(good, limits(BASE_MODEL, config)).rank == 8
