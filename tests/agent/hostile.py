"""Builders of hostile adapters for the agent's tests: raw safetensors bytes, base model configs, adapter dirs."""

from __future__ import annotations

import json
import pathlib
import struct
from typing import Any

import numpy as np
import safetensors.numpy

from .conftest import BASE_MODEL

HIDDEN = 32
LLAMA = {
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "vocab_size": 100,
}
QWEN3_MOE = {
    **LLAMA,
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 16,
    "num_experts": 4,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}


def raw(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file from a header (a dict is JSON-encoded, bytes are taken as they are) and its data region."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def entry(dtype: str, shape: list[Any], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def config(*, rank: int = 8, modules: Any = ("q_proj", "v_proj"), **extra: Any) -> dict[str, Any]:
    modules = list(modules) if isinstance(modules, tuple) else modules
    return {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": modules,
        "base_model_name_or_path": BASE_MODEL,
        **extra,
    }


def lora(
    module: str, *, rank: int = 8, dims: tuple[int, int] = (HIDDEN, HIDDEN), a: bool = True, b: bool = True
) -> dict[str, np.ndarray]:
    """lora_A (rank, in) and lora_B (out, rank) of `module` (its path below the CausalLM), named as peft saves them."""
    tensors = {}
    if a:
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ones((rank, dims[0]), np.float32)
    if b:
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ones((dims[1], rank), np.float32)
    return tensors


def attention(layer: int = 0, **kwargs: Any) -> dict[str, np.ndarray]:
    return {
        **lora(f"model.layers.{layer}.self_attn.q_proj", **kwargs),
        **lora(f"model.layers.{layer}.self_attn.v_proj", **kwargs),
    }


def adapter(
    directory: pathlib.Path, *, weights: bytes | dict[str, np.ndarray], adapter_config: bytes | dict[str, Any]
) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(weights, dict):
        weights = safetensors.numpy.save(weights)
    if isinstance(adapter_config, dict):
        adapter_config = json.dumps(adapter_config).encode()
    (directory / "adapter_model.safetensors").write_bytes(weights)
    (directory / "adapter_config.json").write_bytes(adapter_config)
    return directory


def base_config(directory: pathlib.Path, model: dict[str, Any]) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(model))
    return path
