"""A Qwen3-30B-A3B-shaped model folder and LoRA adapters for it, for vLLM with `--load-format dummy`.

    python benchmarks/vllm_e2e/make_qwen3.py model DIR                 # config.json + a synthetic tokenizer
    python benchmarks/vllm_e2e/make_qwen3.py loras DIR COUNT RANK      # COUNT PEFT adapters of rank RANK
    ... --layers N                                                     # both: the first N layers only

The model has Qwen3-30B-A3B's config.json values (48 layers, hidden 2048, 128 experts of intermediate 768, top-8,
32 query and 4 KV heads of 128) and no weights: vLLM fills them with random values. The tokenizer is one word per
id ("t<i>"), so any token id a benchmark draws decodes and encodes back. Each adapter covers attention (q/k/v/o) and
every expert's gate, up and down projections, under the names vLLM 0.26 maps onto its fused MoE layer
(`mlp.experts.<e>.<proj>`, PEFT's per-expert layout); one random adapter is written and the others hard-link it,
like the GPT-OSS kit's adapters. A test (tests/plugin/test_make_qwen3.py) checks the names against vLLM's own parser.

`--layers N` keeps every layer's shape and drops the others: the whole model and eight adapters need more memory
than an H100 has, so there the model runs at part of its depth, with ratios against a base model of the same depth.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "use_cache": True,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}
SPECIAL = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}
# The same layout at a size the tests write in milliseconds (the vocabulary still holds the special ids).
SMALL = {
    **CONFIG,
    "num_hidden_layers": 2,
    "num_experts": 3,
    "hidden_size": 16,
    "moe_intermediate_size": 8,
    "head_dim": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 151946,
}


def write_model(out: Path, config: dict = CONFIG) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    vocab = {SPECIAL.get(i, f"t{i}"): i for i in range(config["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL.values()])
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


def with_layers(layers: int | None, config: dict = CONFIG) -> dict:
    """The config cut to its first `layers` layers (None: all of them)."""
    if layers is None:
        return config
    if not 1 <= layers <= config["num_hidden_layers"]:
        raise ValueError(f"--layers must be 1..{config['num_hidden_layers']}, not {layers}")
    return {**config, "num_hidden_layers": layers}


def adapter_shapes(config: dict, rank: int) -> dict[str, tuple[int, ...]]:
    """PEFT tensor name -> shape of one adapter: lora_A is (rank, in), lora_B (out, rank)."""
    h, inter = config["hidden_size"], config["moe_intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {}
    for layer in range(config["num_hidden_layers"]):
        p = f"base_model.model.model.layers.{layer}"
        for name, (din, dout) in {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}.items():
            shapes[f"{p}.self_attn.{name}.lora_A.weight"] = (rank, din)
            shapes[f"{p}.self_attn.{name}.lora_B.weight"] = (dout, rank)
        for e in range(config["num_experts"]):
            for name, (din, dout) in {"gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}.items():
                shapes[f"{p}.mlp.experts.{e}.{name}.lora_A.weight"] = (rank, din)
                shapes[f"{p}.mlp.experts.{e}.{name}.lora_B.weight"] = (dout, rank)
    return shapes


def write_loras(out: Path, count: int, rank: int, *, config: dict = CONFIG, device: str = "cpu") -> int:
    """Returns the parameter count of one adapter."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator(device=device).manual_seed(0)
    tensors = {
        name: (torch.randn(*shape, generator=g, device=device) * 0.01).to(torch.bfloat16).cpu()
        for name, shape in adapter_shapes(config, rank).items()
    }
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "base_model_name_or_path": "qwen3-30b-a3b-dummy",
        "use_dora": False,
        "modules_to_save": None,
    }
    first = out / "lora1"
    first.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(first / "adapter_model.safetensors"))
    (first / "adapter_config.json").write_text(json.dumps(adapter_config))
    for i in range(2, count + 1):
        d = out / f"lora{i}"
        d.mkdir(parents=True, exist_ok=True)
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            (d / f).unlink(missing_ok=True)
            os.link(first / f, d / f)
    return sum(t.numel() for t in tensors.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    model = sub.add_parser("model")
    model.add_argument("dir", type=Path)
    loras = sub.add_parser("loras")
    loras.add_argument("dir", type=Path)
    loras.add_argument("count", type=int)
    loras.add_argument("rank", type=int)
    loras.add_argument("--device", default="cpu")
    for sp in (model, loras):
        sp.add_argument("--layers", type=int, default=None, help="the first N layers only (default: all 48)")
    args = p.parse_args(argv)
    try:
        config = with_layers(args.layers)
    except ValueError as e:
        p.error(str(e))
    if args.what == "model":
        write_model(args.dir, config)
        print(f"wrote {args.dir} ({config['num_hidden_layers']} layers)")
    else:
        n = write_loras(args.dir, args.count, args.rank, config=config, device=args.device)
        print(f"{args.count} adapters, rank {args.rank}, {n / 1e6:.1f} M parameters ({2 * n / 1e9:.2f} GB bf16) each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
