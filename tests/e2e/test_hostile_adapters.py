"""Hostile adapters: the builders of every attack (each in its own adapter, with the reason the agent must give), and
a check that the poisoning builders change what they say. tests/e2e/test_server_options.py sends them all through
the local stack (refused by the agent before vLLM loads anything, vLLM undisturbed); benchmarks/agent_rss.py
measures the agent's memory across bursts of them.
"""

from __future__ import annotations

import json
import pathlib
import pickle
import struct
from typing import Any

Q = "base_model.model.model.layers.0.self_attn.q_proj"


def _safetensors(header: dict[str, Any], data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _hostile(good: pathlib.Path, root: pathlib.Path) -> dict[str, tuple[dict[str, bytes], str]]:
    """name -> (files, expected reason): the attacks the issue reports and more, each in its own adapter."""
    config = json.loads((good / "adapter_config.json").read_text())
    config_bytes = json.dumps(config).encode()
    weights = (good / "adapter_model.safetensors").read_bytes()
    zero_size = {
        f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_{ab}.weight": {
            "dtype": "F32",
            "shape": [0, 8],
            "data_offsets": [0, 0],
        }
        for i in range(50_000)
        for ab in "AB"
    }
    wrong_rank = dict(config, r=4)
    names = _names_in_file_order(weights)
    return {
        "h-nan": (
            {"adapter_config.json": config_bytes, "adapter_model.safetensors": _poisoned(weights, names[1], NAN)},
            "WeightsNonFinite",
        ),
        "h-inf": (
            {"adapter_config.json": config_bytes, "adapter_model.safetensors": _poisoned(weights, names[2], INF)},
            "WeightsNonFinite",
        ),
        "h-1e30": (
            {"adapter_config.json": config_bytes, "adapter_model.safetensors": _poisoned(weights, names[0], 1e30)},
            "WeightsOutOfRange",
        ),
        "h-regex-all": (
            {
                "adapter_config.json": json.dumps(dict(config, target_modules=".*")).encode(),
                "adapter_model.safetensors": weights,
            },
            "UnknownTargetModules",
        ),
        "h-modules-to-save": (
            {
                "adapter_config.json": json.dumps(dict(config, modules_to_save=["lm_head", "embed_tokens"])).encode(),
                "adapter_model.safetensors": weights,
            },
            "UnsupportedFeature",
        ),
        "h-pickle": (
            {"adapter_config.json": config_bytes, "adapter_model.safetensors": pickle.dumps({Q: [0.0] * 64})},
            "WeightsInvalid",
        ),
        "h-zero-size": (
            {"adapter_config.json": config_bytes, "adapter_model.safetensors": _safetensors(zero_size)},
            "WeightsMismatch",
        ),
        "h-newline": (
            {
                "adapter_config.json": config_bytes,
                "adapter_model.safetensors": _safetensors(
                    {f"{Q}\nFAKE.lora_A.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
                ),
            },
            "WeightsInvalid",
        ),
        "h-dtype": (
            {
                "adapter_config.json": config_bytes,
                "adapter_model.safetensors": _safetensors(
                    {f"{Q}.lora_A.weight": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8
                ),
            },
            "WeightsInvalid",
        ),
        "h-rank": (
            {"adapter_config.json": json.dumps(wrong_rank).encode(), "adapter_model.safetensors": weights},
            "WeightsMismatch",
        ),
        "h-deep-config": (
            {
                "adapter_config.json": b'{"r": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
                "adapter_model.safetensors": weights,
            },
            "ConfigInvalid",
        ),
        "h-huge-int": (
            {"adapter_config.json": b'{"r": ' + b"9" * 10_000 + b"}", "adapter_model.safetensors": weights},
            "ConfigInvalid",
        ),
        **{
            name: ({"adapter_config.json": config_bytes, "adapter_model.safetensors": body}, reason)
            for name, (body, reason) in _weights_attacks(weights).items()
        },
        "h-config-huge": (
            {"adapter_config.json": b" " * (2 << 20) + config_bytes, "adapter_model.safetensors": weights},
            "ConfigInvalid",
        ),
        "h-config-array": ({"adapter_config.json": b"[1, 2]", "adapter_model.safetensors": weights}, "ConfigInvalid"),
    }


def _header(weights: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack("<Q", weights[:8])
    return json.loads(weights[8 : 8 + length]), weights[8 + length :]


NAN, INF = float("nan"), float("inf")
_PACK = {"F32": "<f", "F16": "<e"}


def _names_in_file_order(weights: bytes) -> list[str]:
    header, _ = _header(weights)
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def _poisoned(weights: bytes, name: str, value: float) -> bytes:
    """The good adapter with one element in the middle of tensor `name` set to `value` (F32, F16 or BF16)."""
    header, data = _header(weights)
    dtype, (begin, end) = header[name]["dtype"], header[name]["data_offsets"]
    size = 4 if dtype == "F32" else 2
    raw = struct.pack("<f", value)[2:] if dtype == "BF16" else struct.pack(_PACK[dtype], value)
    at = begin + ((end - begin) // size // 2) * size
    changed = data[:at] + raw + data[at + size :]
    return weights[: len(weights) - len(data)] + changed


def _reshaped(weights: bytes, name: str, shape: list[int]) -> bytes:
    """The good adapter with one tensor given another shape (and a data region that fits it exactly)."""
    header, _ = _header(weights)
    header.pop("__metadata__", None)
    header[name] = dict(header[name], shape=shape)
    offset, data = 0, b""
    for key in sorted(header):
        size = 4 * _numel(header[key]["shape"])
        header[key] = dict(header[key], dtype="F32", data_offsets=[offset, offset + size])
        data += b"\0" * size
        offset += size
    return _safetensors(header, data)


def _numel(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _weights_attacks(weights: bytes) -> dict[str, tuple[bytes, str]]:
    """Attacks on the weights file itself; each is refused by the agent's own parser or the base-model checks."""
    header, data = _header(weights)
    names = sorted(k for k in header if k != "__metadata__")
    a_name = next(k for k in names if k.endswith("lora_A.weight"))
    b_name = a_name.replace("lora_A", "lora_B")
    rank, fan_in = header[a_name]["shape"]
    fan_out = header[b_name]["shape"][0]
    one = {f"{Q}.lora_A.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    layer = a_name.split(".layers.")[1].split(".")[0]
    return {
        "h-header-zero": (struct.pack("<Q", 0) + b"{}", "WeightsInvalid"),
        "h-one-byte": (b"\x01", "WeightsInvalid"),
        "h-seven-bytes": (b"\x01" * 7, "WeightsInvalid"),
        "h-header-2to64": (struct.pack("<Q", 2**64 - 1) + b"{}", "WeightsInvalid"),
        "h-header-past-file": (struct.pack("<Q", 1 << 20) + b"{}", "WeightsInvalid"),
        "h-not-json": (struct.pack("<Q", 9) + b"not json!", "WeightsInvalid"),
        "h-json-array": (_safetensors([1, 2, 3]), "WeightsInvalid"),  # type: ignore[arg-type]
        "h-past-end": (
            _safetensors({k: dict(v, data_offsets=[0, 4096]) for k, v in one.items()}, b"\0" * 4),
            "WeightsInvalid",
        ),
        "h-overlap": (
            _safetensors(
                {**one, f"{Q}.lora_B.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
            ),
            "WeightsInvalid",
        ),
        "h-gap": (
            _safetensors(
                {**one, f"{Q}.lora_B.weight": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12
            ),
            "WeightsInvalid",
        ),
        "h-trailing": (_safetensors(one, b"\0" * 8), "WeightsInvalid"),
        "h-bool": (
            _safetensors({f"{Q}.lora_A.weight": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4),
            "WeightsInvalid",
        ),
        "h-negative-shape": (
            _safetensors({f"{Q}.lora_A.weight": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
            "WeightsInvalid",
        ),
        "h-numel-mismatch": (
            _safetensors({f"{Q}.lora_A.weight": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}}, b"\0" * 4),
            "WeightsInvalid",
        ),
        "h-nul-name": (
            _safetensors({f"{Q}\u0000.lora_A.weight": one[f"{Q}.lora_A.weight"]}, b"\0" * 4),
            "WeightsInvalid",
        ),
        "h-rtl-name": (
            _safetensors({f"{Q}\u202e.lora_A.weight": one[f"{Q}.lora_A.weight"]}, b"\0" * 4),
            "WeightsInvalid",
        ),
        "h-a-without-b": (_only(weights, a_name), "WeightsInvalid"),
        "h-a-off-by-one": (_reshaped(weights, a_name, [rank, fan_in + 1]), "WeightsMismatch"),
        "h-b-off-by-one": (_reshaped(weights, b_name, [fan_out - 1, rank]), "WeightsMismatch"),
        "h-absent-layer": (_renamed(weights, f".layers.{layer}.", ".layers.999."), "WeightsMismatch"),
        "h-absent-module": (_renamed(weights, ".q_proj.", ".qq_proj."), "WeightsMismatch"),
    }


def _only(weights: bytes, keep: str) -> bytes:
    header, data = _header(weights)
    begin, end = header[keep]["data_offsets"]
    return _safetensors({keep: dict(header[keep], data_offsets=[0, end - begin])}, data[begin:end])


def _renamed(weights: bytes, old: str, new: str) -> bytes:
    header, data = _header(weights)
    return _safetensors({key.replace(old, new): value for key, value in header.items()}, data)


def test_a_poisoned_file_is_what_the_agent_refuses(tmp_path: pathlib.Path) -> None:
    """The NaN/Inf/1e30 builders poison what they say, in the tensor they say (F32, F16 and BF16 words)."""
    import numpy as np
    import safetensors.numpy

    good = {"a.lora_A.weight": np.ones((2, 3), np.float32), "b.lora_B.weight": np.ones((3, 2), np.float16)}
    weights = safetensors.numpy.save(good)
    for name, value in (("a.lora_A.weight", NAN), ("b.lora_B.weight", INF), ("a.lora_A.weight", 1e30)):
        loaded = safetensors.numpy.load(_poisoned(weights, name, value))
        changed = [k for k in loaded if not np.array_equal(loaded[k], good[k])]
        assert changed == [name]
        flat = loaded[name].astype(np.float64).reshape(-1)
        assert np.isnan(flat[3]) if value != value else flat[3] == np.float64(good[name].dtype.type(value))
