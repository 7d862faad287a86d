"""peft's fused MoE expert LoRA (target_parameters) rewritten per expert: detection from the config alone, and a
rewrite whose every expert's delta B @ A * scaling, with the scaling vLLM resolves for the new names, equals the delta
peft itself applies (real peft adapters on a tiny transformers-5 Qwen3-MoE, whose experts are 3D parameters)."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from moelora.agent.check import peft_moe
from moelora.agent.errors import AdapterError
from moelora.api import FailureReason

ATTENTION = ["q_proj", "v_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def _config(**overrides: Any) -> dict[str, Any]:
    return {"r": 4, "lora_alpha": 8, "target_modules": ATTENTION, "target_parameters": EXPERTS, **overrides}


# ---- detection, before any weights --------------------------------------------------------------------------------


def test_plan_is_none_without_target_parameters() -> None:
    assert peft_moe.plan(_config(target_parameters=None), base_model="org/qwen3-moe") is None
    assert peft_moe.plan({"r": 4, "target_modules": ATTENTION}, base_model="org/qwen3-moe") is None


def test_plan_names_fused_expert_parameters() -> None:
    plan = peft_moe.plan(_config(), base_model="Qwen/Qwen3-30B-A3B")
    assert plan == peft_moe.Plan(parameters=tuple(EXPERTS))
    assert peft_moe.plan(_config(target_parameters=["down_proj"]), base_model="x") is not None


def test_plan_leaves_gpt_oss_alone_because_vllm_reads_its_fused_layout() -> None:
    assert peft_moe.plan(_config(), base_model="openai/gpt-oss-20b") is None


@pytest.mark.parametrize(
    "parameters",
    [["mlp.router.weight"], ["mlp.experts.gate_up_proj", "self_attn.q_proj.weight"], "mlp.experts.down_proj", [3]],
)
def test_plan_refuses_what_vllm_cannot_serve(parameters: Any) -> None:
    with pytest.raises(AdapterError) as caught:
        peft_moe.plan(_config(target_parameters=parameters), base_model="x")
    assert caught.value.reason is FailureReason.CONFIG_INVALID


def test_cache_version_maps_the_rewrite_to_its_entry() -> None:
    assert peft_moe.cache_version(f"/cache/abc123/{peft_moe.CONVERTED_DIR}") == "abc123"
    assert peft_moe.cache_version("/cache/abc123") == "abc123"


# ---- the rewrite, against real peft adapters -----------------------------------------------------------------------


def _peft_adapter(path: pathlib.Path, *, hidden: int, inter: int, experts: int = 4, **lora: Any) -> Any:
    """A peft LoRA (attention modules + fused expert parameters) on a tiny 1-layer Qwen3-MoE, saved to `path`;
    returns the peft model (random lora_B, since peft starts it at zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=inter,
        num_experts=experts,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        mlp_only_layers=[],
    )
    base = Qwen3MoeForCausalLM(config)
    assert base.model.layers[0].mlp.experts.gate_up_proj.ndim == 3  # transformers 5 keeps experts fused
    settings = {"r": 4, "lora_alpha": 8, **lora}
    model = get_peft_model(
        base, LoraConfig(target_modules=ATTENTION, target_parameters=EXPERTS, lora_dropout=0.0, **settings)
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape) * 0.5)
    model.save_pretrained(str(path), safe_serialization=True)
    (path / "README.md").unlink(missing_ok=True)
    return model


def _peft_deltas(model: Any, inter: int) -> dict[str, torch.Tensor]:
    """Per-expert (out, in) deltas peft applies, keyed like the rewritten modules (`...mlp.experts.<e>.<proj>`)."""
    from peft.tuners.lora.layer import ParamWrapper

    deltas = {}
    for name, module in model.named_modules():
        if not isinstance(module, ParamWrapper):
            continue
        prefix = re.sub(r"(\.base_layer)+$", "", name.removeprefix("base_model.model."))
        delta = module.get_delta_weight("default").float()  # (experts, out, in): Qwen3-MoE stores (E, out, in)
        for e in range(delta.shape[0]):
            if module.parameter_name == "gate_up_proj":
                deltas[f"{prefix}.{e}.gate_proj"] = delta[e, :inter]
                deltas[f"{prefix}.{e}.up_proj"] = delta[e, inter:]
            else:
                deltas[f"{prefix}.{e}.down_proj"] = delta[e]
    return deltas


def _vllm_deltas(directory: pathlib.Path, *, patterns: bool = True) -> dict[str, torch.Tensor]:
    """Per-module B @ A * scaling as vLLM reads the directory (its own PEFTHelper resolves rank and scaling);
    `patterns=False`: as a vLLM that ignores rank_pattern/alpha_pattern would."""
    helper_module = pytest.importorskip("vllm.lora.peft_helper")
    config = json.loads((directory / "adapter_config.json").read_text())
    if not patterns:
        config = dict(config, rank_pattern={}, alpha_pattern={})
    helper = helper_module.PEFTHelper.from_dict(config)
    tensors = load_file(str(directory / "adapter_model.safetensors"))
    deltas = {}
    for key, a in tensors.items():
        if key.endswith(".lora_A.weight"):
            module = key.removesuffix(".lora_A.weight").removeprefix("base_model.model.")
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            deltas[module] = (b.float() @ a.float()) * helper.get_rank_and_scaling(module)[1]
    return deltas


def _convert(path: pathlib.Path) -> pathlib.Path:
    config = json.loads((path / "adapter_config.json").read_text())
    assert peft_moe.plan(config, base_model="moelora/tiny-qwen3-moe") is not None
    return peft_moe.servable(path, base_model="moelora/tiny-qwen3-moe")


# peft 0.21 warns that patterns naming a target parameter matched no module, yet applies them (the ranks show it).
@pytest.mark.filterwarnings("ignore:The following (rank|alpha)_pattern keys did not match:RuntimeWarning")
@pytest.mark.parametrize(
    ("hidden", "inter", "lora"),
    [
        (16, 8, {}),  # hidden == 2 * intermediate: gate_up's and down's lora_B have the same shape
        (24, 8, {}),
        (16, 8, {"rank_pattern": {"gate_up_proj": 2}, "alpha_pattern": {"down_proj": 3, "q_proj": 5}}),
        (16, 8, {"use_rslora": True}),
        (16, 8, {"use_rslora": True, "rank_pattern": {"down_proj": 6}, "lora_alpha": 7}),
    ],
    ids=["square", "wide", "patterns", "rslora", "rslora-patterns"],
)
def test_rewrite_keeps_every_experts_delta(tmp_path: pathlib.Path, hidden: int, inter: int, lora: Any) -> None:
    model = _peft_adapter(tmp_path, hidden=hidden, inter=inter, **lora)
    out = _convert(tmp_path)
    assert out == tmp_path / peft_moe.CONVERTED_DIR

    ranks = lora.get("rank_pattern", {})
    original = load_file(str(tmp_path / "adapter_model.safetensors"))
    experts = "base_model.model.model.layers.0.mlp.experts"
    assert original[f"{experts}.base_layer.lora_A.weight"].shape[0] == 4 * ranks.get("gate_up_proj", 4)
    assert original[f"{experts}.lora_A.weight"].shape[0] == 4 * ranks.get("down_proj", 4)
    want = _peft_deltas(model, inter)
    got = _vllm_deltas(out)
    assert len(want) == 4 * 3
    without_patterns = _vllm_deltas(out, patterns=False)
    for module, delta in want.items():
        torch.testing.assert_close(got[module], delta, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(without_patterns[module], delta, rtol=1e-5, atol=1e-6)
    # attention passes through untouched, bit for bit
    rewritten = load_file(str(out / "adapter_model.safetensors"))
    attention = [k for k in original if "self_attn" in k]
    assert attention and all(torch.equal(original[k], rewritten[k]) for k in attention)
    assert not [k for k in rewritten if k.endswith(("experts.lora_A.weight", "base_layer.lora_A.weight"))]


def test_rewrite_names_shapes_and_config(tmp_path: pathlib.Path) -> None:
    _peft_adapter(tmp_path, hidden=24, inter=8, experts=4)
    out = _convert(tmp_path)
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as reader:
        shapes = {k: tuple(reader.get_slice(k).get_shape()) for k in reader.keys()}
        assert reader.metadata() == {"format": "pt"}
    experts = "base_model.model.model.layers.0.mlp.experts"
    for e in range(4):
        assert shapes[f"{experts}.{e}.gate_proj.lora_A.weight"] == (4, 24)
        assert shapes[f"{experts}.{e}.up_proj.lora_B.weight"] == (8, 4)
        assert shapes[f"{experts}.{e}.down_proj.lora_A.weight"] == (4, 8)
        assert shapes[f"{experts}.{e}.down_proj.lora_B.weight"] == (24, 4)
    assert len(shapes) == 4 + 4 * 3 * 2
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["target_parameters"] is None
    assert sorted(config["target_modules"]) == ["down_proj", "gate_proj", "q_proj", "up_proj", "v_proj"]
    original = json.loads((tmp_path / "adapter_config.json").read_text())
    assert {k: v for k, v in config.items() if k not in ("target_modules", "target_parameters")} == {
        k: v for k, v in original.items() if k not in ("target_modules", "target_parameters")
    }


@pytest.mark.filterwarnings("ignore:The following rank_pattern keys did not match:RuntimeWarning")
def test_rewrite_keeps_bfloat16(tmp_path: pathlib.Path) -> None:
    _peft_adapter(tmp_path, hidden=16, inter=8, rank_pattern={"down_proj": 2})
    weights = tmp_path / "adapter_model.safetensors"  # peft saves fp32 LoRA weights: cast them as a trainer might
    save_file({k: t.to(torch.bfloat16) for k, t in load_file(str(weights)).items()}, str(weights))
    out = _convert(tmp_path)
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    original = load_file(str(tmp_path / "adapter_model.safetensors"))
    a = original["base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight"].view(4, 4, 16)
    assert torch.equal(tensors["base_model.model.model.layers.0.mlp.experts.2.up_proj.lora_A.weight"], a[2])


@pytest.mark.filterwarnings("ignore:The following alpha_pattern keys did not match:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_folded_scaling_is_torchs_bit_for_bit(tmp_path: pathlib.Path, dtype: torch.dtype) -> None:
    """lora_B times the folded factor, computed on raw words without torch, equals torch's (t.float() * f).to(dtype)."""
    _peft_adapter(tmp_path, hidden=16, inter=8, alpha_pattern={"down_proj": 3})
    weights = tmp_path / "adapter_model.safetensors"
    save_file({k: t.to(dtype) for k, t in load_file(str(weights)).items()}, str(weights), metadata={"format": "pt"})
    out = _convert(tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    converted = json.loads((out / "adapter_config.json").read_text())
    experts = "model.layers.0.mlp.experts"
    factor = (
        peft_moe.rank_and_scaling(config, f"{experts}.down_proj")[1]
        / peft_moe.rank_and_scaling(converted, f"{experts}.0.down_proj")[1]
    )
    assert factor != 1.0
    down_b = load_file(str(weights))[f"base_model.model.{experts}.lora_B.weight"]  # down_proj wraps outermost
    rewritten = load_file(str(out / "adapter_model.safetensors"))
    for e in range(4):
        want = (down_b.view(16, 4, 4)[:, :, e].float() * factor).to(dtype)
        assert torch.equal(rewritten[f"base_model.model.{experts}.{e}.down_proj.lora_B.weight"], want)


def test_wrappers_are_told_apart_by_shape_not_nesting(tmp_path: pathlib.Path) -> None:
    """A module registering down_proj first would nest it innermost: the shapes still say which is which."""
    model = _peft_adapter(tmp_path, hidden=24, inter=8)
    weights = tmp_path / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    swapped = {}
    for key, tensor in tensors.items():
        if ".experts.base_layer." in key:
            key = key.replace(".experts.base_layer.", ".experts.")
        elif ".experts." in key:
            key = key.replace(".experts.", ".experts.base_layer.")
        swapped[key] = tensor
    save_file(swapped, str(weights), metadata={"format": "pt"})
    got = _vllm_deltas(_convert(tmp_path))
    for module, delta in _peft_deltas(model, 8).items():
        torch.testing.assert_close(got[module], delta, rtol=1e-5, atol=1e-6)


def test_servable_is_atomic_and_done_once(tmp_path: pathlib.Path) -> None:
    _peft_adapter(tmp_path, hidden=16, inter=8)
    out = _convert(tmp_path)
    first = (out / "adapter_model.safetensors").stat().st_mtime_ns
    assert _convert(tmp_path) == out
    assert (out / "adapter_model.safetensors").stat().st_mtime_ns == first
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [peft_moe.CONVERTED_DIR]


def test_plain_adapter_is_served_from_its_own_directory(tmp_path: pathlib.Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps(_config(target_parameters=None)))
    assert peft_moe.servable(tmp_path, base_model="x") == tmp_path
    assert list(tmp_path.iterdir()) == [tmp_path / "adapter_config.json"]


def test_mismatched_tensors_fail_and_leave_nothing(tmp_path: pathlib.Path) -> None:
    _peft_adapter(tmp_path, hidden=24, inter=8)
    weights = tmp_path / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    del tensors["base_model.model.model.layers.0.mlp.experts.lora_B.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(AdapterError) as caught:
        _convert(tmp_path)
    assert caught.value.reason is FailureReason.CONFIG_INVALID
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_unreadable_weights_are_the_adapters_fault(tmp_path: pathlib.Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps(_config()))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(AdapterError) as caught:
        _convert(tmp_path)
    assert caught.value.reason is FailureReason.WEIGHTS_INVALID  # the agent's own strict parser reads it
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


@pytest.mark.filterwarnings("ignore:The following rank_pattern keys did not match")  # peft applies them all the same
def test_a_rank_pattern_on_a_fused_parameter_passes_the_tensor_checks(tmp_path: pathlib.Path) -> None:
    """peft matches rank_pattern against the parameter's full name (…experts.gate_up_proj): the checks must too."""
    from moelora.agent.check.validate import Limits, validate

    model = _peft_adapter(tmp_path / "adapter", hidden=32, inter=16, rank_pattern={"gate_up_proj": 2})
    model.base_model.model.config.save_pretrained(str(tmp_path / "base"))
    config_file = tmp_path / "adapter" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    assert config["rank_pattern"] == {"gate_up_proj": 2}
    config_file.write_text(json.dumps({**config, "base_model_name_or_path": "org/tiny-qwen3-moe"}))
    limits = Limits(
        base_model="org/tiny-qwen3-moe",
        max_rank=16,
        target_modules=frozenset(),
        max_bytes=1 << 30,
        base_config=tmp_path / "base" / "config.json",
    )
    assert validate(tmp_path / "adapter", limits).rank == 4
