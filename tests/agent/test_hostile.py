"""Hostile adapters, each refused before vLLM sees it, with its own reason and a message naming the problem."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
from typing import Any

import numpy as np
import pytest

from moelora.agent.check.validate import Limits, validate
from moelora.agent.errors import AdapterError
from moelora.api import FailureReason

from .conftest import BASE_MODEL
from .hostile import LLAMA, QWEN3_MOE, adapter, attention, base_config, config, entry, lora, raw

LIMITS = Limits(
    base_model=BASE_MODEL,
    max_rank=16,
    target_modules=frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    max_bytes=64 << 20,
)
F32_8x32 = 8 * 32 * 4
Q = "base_model.model.model.layers.0.self_attn.q_proj"


FUSED_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def fused(*, experts: int = 4, rank: int = 8, hidden: int = 32, inter: int = 16) -> dict[str, np.ndarray]:
    """Layer 0's experts as peft's target_parameters saves them: gate_up wrapped first (one base_layer deeper)."""
    prefix = "base_model.model.model.layers.0.mlp.experts"
    shapes = {f"{prefix}.base_layer": (hidden, 2 * inter), prefix: (inter, hidden)}
    tensors = {}
    for module, (d_in, d_out) in shapes.items():
        tensors[f"{module}.lora_A.weight"] = np.ones((experts * rank, d_in), np.float32)
        tensors[f"{module}.lora_B.weight"] = np.ones((d_out, rank * experts), np.float32)
    return tensors


def poisoned(value: float, *, tensor: int = 1, dtype: type = np.float32) -> dict[str, np.ndarray]:
    """The attention adapter with one element of its `tensor`-th tensor (in file order) set to `value`."""
    tensors = {k: v.astype(dtype) for k, v in sorted(attention().items())}
    name = sorted(tensors)[tensor]
    tensors[name].flat[5] = value
    return tensors


def many_tensors(count: int) -> bytes:
    """`count` zero-size tensors for layers the model does not have (the 12.9 MB file that stalled inference)."""
    header = {
        f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_{ab}.weight": entry("F32", [0, 32], 0, 0)
        for i in range(count // 2)
        for ab in "AB"
    }
    return raw(header)


def deep_config(depth: int) -> bytes:
    return b'{"r": 8, "x": ' + b"[" * depth + b"]" * depth + b"}"


# (case, weights, adapter config, base model config or None, reason, words the message must contain)
CASES: list[tuple[str, Any, Any, dict[str, Any] | None, FailureReason, str]] = [
    ("header length 0", raw(b"", length=0), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "header length is 0"),
    ("1-byte file", b"\x01", config(), LLAMA, FailureReason.WEIGHTS_INVALID, "too short"),
    ("7-byte file", b"\x07" * 7, config(), LLAMA, FailureReason.WEIGHTS_INVALID, "too short"),
    ("length 2^64-1", raw(b"{}", length=2**64 - 1), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "over the limit"),
    ("length past the file", raw(b"{}", length=4096), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "larger than"),
    ("pickle bytes", pickle.dumps({Q: [0.0] * 64}), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "pickle"),
    ("zip archive", b"PK\x03\x04" + b"\0" * 60, config(), LLAMA, FailureReason.WEIGHTS_INVALID, "zip"),
    ("non-JSON header", raw(b"{not json at all}"), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "not valid JSON"),
    ("JSON array header", raw(b"[1, 2, 3]"), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "not a JSON object"),
    (
        "JSON deeply nested",
        raw(b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "JSON",
    ),
    ("duplicate names", raw(b'{"a": 1, "a": 2}'), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "duplicate key"),
    (
        "offsets past the end",
        raw({f"{Q}.lora_A.weight": entry("F32", [8, 32], 0, F32_8x32)}, b"\0" * 100),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "outside the data",
    ),
    (
        "overlapping ranges",
        raw(
            {
                f"{Q}.lora_A.weight": entry("F32", [8, 32], 0, F32_8x32),
                f"{Q}.lora_B.weight": entry("F32", [32, 8], 4, 4 + F32_8x32),
            },
            b"\0" * (F32_8x32 + 4),
        ),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "overlaps",
    ),
    (
        "gap between ranges",
        raw(
            {
                f"{Q}.lora_A.weight": entry("F32", [8, 32], 0, F32_8x32),
                f"{Q}.lora_B.weight": entry("F32", [32, 8], F32_8x32 + 4, 2 * F32_8x32 + 4),
            },
            b"\0" * (2 * F32_8x32 + 4),
        ),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "belong to no tensor",
    ),
    (
        "trailing bytes",
        raw({f"{Q}.lora_A.weight": entry("F32", [8, 32], 0, F32_8x32)}, b"\0" * (F32_8x32 + 3)),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "trailing bytes",
    ),
    (
        "dtype I64",
        raw({f"{Q}.lora_A.weight": entry("I64", [8, 32], 0, 8 * 256)}, b"\0" * 8 * 256),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "refused dtype 'I64'",
    ),
    (
        "dtype BOOL",
        raw({f"{Q}.lora_A.weight": entry("BOOL", [8, 32], 0, 256)}, b"\0" * 256),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "refused dtype 'BOOL'",
    ),
    (
        "unknown dtype",
        raw({f"{Q}.lora_A.weight": entry("F7", [8, 32], 0, 256)}, b"\0" * 256),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "unknown dtype 'F7'",
    ),
    (
        "negative shape",
        raw({f"{Q}.lora_A.weight": entry("F32", [-8, 32], 0, 0)}),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "non-negative integers",
    ),
    (
        "non-int shape",
        raw({f"{Q}.lora_A.weight": entry("F32", [8.0, "32"], 0, 0)}),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "non-negative integers",
    ),
    (
        "numel*itemsize != length",
        raw({f"{Q}.lora_A.weight": entry("F32", [8, 32], 0, 1000)}, b"\0" * 1000),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "needs 1024 bytes",
    ),
    (
        "__metadata__ not strings",
        raw({"__metadata__": {"format": 1}}),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "__metadata__",
    ),
    ("no tensors", raw({}), config(), LLAMA, FailureReason.WEIGHTS_INVALID, "no tensors"),
    (
        "not a LoRA tensor",
        {"padding": np.zeros(4, np.float32)},
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "not a LoRA weight",
    ),
    (
        "name with newline",
        {f"{Q}\n.lora_A.weight": np.zeros((8, 32), np.float32)},
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "\\n",
    ),
    (
        "name with NUL",
        {f"{Q}\0.lora_A.weight": np.zeros((8, 32), np.float32)},
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "\\x00",
    ),
    (
        "name with unicode",
        {f"{Q}\u202e.lora_A.weight": np.zeros((8, 32), np.float32)},
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "\\u202e",
    ),
    (
        "lora_A without lora_B",
        lora("model.layers.0.self_attn.q_proj", b=False),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_INVALID,
        "without lora_B",
    ),
    (
        "zero-size lora_A",
        {**lora("model.layers.0.self_attn.q_proj", rank=0)},
        config(),
        None,
        FailureReason.WEIGHTS_INVALID,
        "empty dims",
    ),
    ("100,000 tensors", many_tensors(100_000), config(), LLAMA, FailureReason.WEIGHTS_MISMATCH, "two tensors each"),
    (
        "100,000 tensors, no base config",
        many_tensors(100_000),
        config(),
        None,
        FailureReason.WEIGHTS_INVALID,
        "empty dims",
    ),
    (
        "lora_A one column too many",
        lora("model.layers.0.self_attn.q_proj", dims=(33, 32)),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_MISMATCH,
        "(in, out) = (32, 32)",
    ),
    (
        "lora_B one row too few",
        lora("model.layers.0.self_attn.v_proj", dims=(32, 31)),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_MISMATCH,
        "make it (32, 31)",
    ),
    ("rank differs from r", attention(rank=4), config(rank=8), LLAMA, FailureReason.WEIGHTS_MISMATCH, "rank [8]"),
    (
        "rank differs from r, no base config",
        attention(rank=4),
        config(rank=8),
        None,
        FailureReason.WEIGHTS_MISMATCH,
        "rank [8]",
    ),
    (
        "rank_pattern not followed",
        attention(rank=8),
        config(rank=8, rank_pattern={"v_proj": 4}),
        LLAMA,
        FailureReason.WEIGHTS_MISMATCH,
        "rank [4]",
    ),
    (
        "A and B disagree on rank",
        {
            **lora("model.layers.0.self_attn.q_proj", b=False),
            **lora("model.layers.0.self_attn.q_proj", rank=7, a=False),
        },
        config(),
        None,
        FailureReason.WEIGHTS_MISMATCH,
        "do not have",
    ),
    (
        "layer beyond num_hidden_layers",
        attention(layer=2),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_MISMATCH,
        "no module 'model.layers.2.self_attn.q_proj'",
    ),
    (
        "a module the model lacks",
        lora("model.layers.0.mlp.q_proj"),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_MISMATCH,
        "no module 'model.layers.0.mlp.q_proj'",
    ),
    (
        "expert index >= num_experts",
        lora("model.layers.0.mlp.experts.4.gate_proj", dims=(32, 16)),
        config(modules=["gate_proj"]),
        QWEN3_MOE,
        FailureReason.WEIGHTS_MISMATCH,
        "mlp.experts.4.gate_proj",
    ),
    (
        "experts on a dense model",
        lora("model.layers.0.mlp.experts.0.gate_proj", dims=(32, 16)),
        config(modules=["gate_proj"]),
        LLAMA,
        FailureReason.WEIGHTS_MISMATCH,
        "no module",
    ),
    (
        "a module target_modules does not name",
        lora("model.layers.0.self_attn.k_proj"),
        config(),
        LLAMA,
        FailureReason.WEIGHTS_MISMATCH,
        "target_modules does not name",
    ),
    (
        "a module the server does not allow",
        lora("lm_head", dims=(32, 100)),
        config(modules=["lm_head"]),
        LLAMA,
        FailureReason.UNSUPPORTED_TARGET_MODULES,
        "lm_head",
    ),
    (
        "fused experts, wrong expert count",
        {**fused(experts=3)},
        config(target_parameters=FUSED_PARAMETERS),
        QWEN3_MOE,
        FailureReason.WEIGHTS_MISMATCH,
        "4 experts",
    ),
    (
        "fused experts, dims fit no parameter",
        fused(inter=15),
        config(target_parameters=FUSED_PARAMETERS),
        QWEN3_MOE,
        FailureReason.WEIGHTS_MISMATCH,
        "fits none",
    ),
    (
        "fused experts not in target_parameters",
        fused(),
        config(),
        QWEN3_MOE,
        FailureReason.WEIGHTS_MISMATCH,
        "target_modules does not name",
    ),
    ("config nested 10,000 deep", attention(), deep_config(10_000), LLAMA, FailureReason.CONFIG_INVALID, "JSON"),
    ("config nested 50 deep", attention(), deep_config(50), LLAMA, FailureReason.CONFIG_INVALID, "levels deep"),
    (
        "config with a 10,000-digit integer",
        attention(),
        b'{"r": ' + b"9" * 10_000 + b"}",
        LLAMA,
        FailureReason.CONFIG_INVALID,
        "digits",
    ),
    (
        "config r of 4,000 digits",
        attention(),
        b'{"r": ' + b"9" * 4000 + b', "target_modules": ["q_proj"], '
        b'"base_model_name_or_path": "' + BASE_MODEL.encode() + b'"}',
        LLAMA,
        FailureReason.RANK_TOO_HIGH,
        "bits",
    ),
    (
        "oversized config",
        attention(),
        b'{"r": 8, "pad": "' + b"x" * (2 << 20) + b'"}',
        LLAMA,
        FailureReason.CONFIG_INVALID,
        "not a config",
    ),
    ("config with NaN", attention(), b'{"r": NaN}', LLAMA, FailureReason.CONFIG_INVALID, "NaN"),
    ("NaN weight", poisoned(np.nan), config(), LLAMA, FailureReason.WEIGHTS_NON_FINITE, "lora_B.weight' holds nan"),
    ("Inf weight", poisoned(np.inf, dtype=np.float16), config(), LLAMA, FailureReason.WEIGHTS_NON_FINITE, "inf"),
    ("1e30 weight", poisoned(1e30, tensor=0), config(), LLAMA, FailureReason.WEIGHTS_OUT_OF_RANGE, "1e+30"),
    ("lora_alpha 1e30", attention(), config(lora_alpha=1e30), LLAMA, FailureReason.WEIGHTS_OUT_OF_RANGE, "scaling"),
    (
        "lora_alpha 1e400 (inf once parsed)",
        attention(),
        json.dumps(config(lora_alpha=12345)).replace("12345", "1e400").encode(),
        LLAMA,
        FailureReason.CONFIG_INVALID,
        "inf",
    ),
    ("target_modules '.*'", attention(), config(modules=".*"), LLAMA, FailureReason.UNKNOWN_TARGET_MODULES, "'model'"),
    (
        "target_modules naming no module",
        attention(),
        config(modules=["q_proj", "v_proj", "w1"]),
        LLAMA,
        FailureReason.UNKNOWN_TARGET_MODULES,
        "'w1'",
    ),
    (
        "modules_to_save",
        attention(),
        config(modules_to_save=["lm_head", "embed_tokens"]),
        LLAMA,
        FailureReason.UNSUPPORTED_FEATURE,
        "modules_to_save",
    ),
    (
        "config with a newline in peft_type",
        attention(),
        config(peft_type="LORA\nIA3"),
        LLAMA,
        FailureReason.CONFIG_INVALID,
        "'LORA\\nIA3'",
    ),
]


@pytest.mark.parametrize(
    "weights, adapter_config, model, reason, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hostile_adapter_is_refused(
    tmp_path: pathlib.Path,
    weights: Any,
    adapter_config: Any,
    model: dict[str, Any] | None,
    reason: FailureReason,
    words: str,
) -> None:
    directory = adapter(tmp_path / "adapter", weights=weights, adapter_config=adapter_config)
    limits = dataclasses.replace(LIMITS, base_config=base_config(tmp_path / "base", model) if model else None)
    with pytest.raises(AdapterError) as caught:
        validate(directory, limits)
    assert caught.value.reason is reason, caught.value.message
    assert words in caught.value.message, caught.value.message
    assert caught.value.message.isprintable() and len(caught.value.message) < 1000


def test_at_least_25_distinct_hostile_cases() -> None:
    assert len({case[0] for case in CASES}) == len(CASES) >= 25


@pytest.mark.parametrize(
    "model, weights, modules",
    [
        (LLAMA, attention(layer=1), ["q_proj", "v_proj"]),
        (
            LLAMA,
            {
                **lora("model.layers.0.mlp.gate_proj", dims=(32, 64)),
                **lora("model.layers.1.mlp.down_proj", dims=(64, 32)),
            },
            ["gate_proj", "down_proj"],
        ),
        (
            QWEN3_MOE,
            {
                **lora("model.layers.1.mlp.experts.3.gate_proj", dims=(32, 16)),
                **lora("model.layers.1.mlp.experts.3.down_proj", dims=(16, 32)),
            },
            ["gate_proj", "down_proj"],
        ),
        ({**QWEN3_MOE, "mlp_only_layers": [1]}, lora("model.layers.1.mlp.up_proj", dims=(32, 64)), ["up_proj"]),
        (None, lora("model.layers.40.self_attn.q_proj", dims=(5000, 7)), ["q_proj"]),
        (QWEN3_MOE, {**attention(), **fused()}, ["q_proj", "v_proj"]),
    ],
    ids=["dense attention", "dense mlp", "qwen3-moe experts", "qwen3-moe dense layer", "no base config", "fused 3-D"],
)
def test_well_formed_adapters_pass(
    tmp_path: pathlib.Path, model: dict[str, Any] | None, weights: dict[str, Any], modules: list[str]
) -> None:
    adapter_config = config(modules=modules, target_parameters=FUSED_PARAMETERS)
    directory = adapter(tmp_path / "adapter", weights=weights, adapter_config=adapter_config)
    limits = dataclasses.replace(LIMITS, base_config=base_config(tmp_path / "base", model) if model else None)
    assert validate(directory, limits).rank == 8


def test_an_unknown_architecture_skips_only_the_dims(tmp_path: pathlib.Path) -> None:
    limits = dataclasses.replace(LIMITS, base_config=base_config(tmp_path / "base", {"model_type": "mamba"}))
    odd = lora("model.layers.9.self_attn.q_proj", dims=(7, 9))
    validate(adapter(tmp_path / "a", weights=odd, adapter_config=config(modules=["q_proj"])), limits)
    bad = lora("model.layers.9.self_attn.q_proj", rank=4)
    with pytest.raises(AdapterError, match="rank"):
        validate(adapter(tmp_path / "b", weights=bad, adapter_config=config(modules=["q_proj"])), limits)


def test_a_configured_but_missing_base_config_is_retried(tmp_path: pathlib.Path) -> None:
    from moelora.agent.errors import TransientError

    limits = dataclasses.replace(LIMITS, base_config=tmp_path / "not-yet" / "config.json")
    with pytest.raises(TransientError, match="base model's config"):
        validate(adapter(tmp_path / "a", weights=attention(), adapter_config=config()), limits)


def test_messages_never_carry_raw_control_characters(tmp_path: pathlib.Path) -> None:
    name = "base_model.model.x\n\x1b[31mFAKE: loaded\r.lora_A.weight"
    directory = adapter(tmp_path / "a", weights={name: np.zeros((8, 32), np.float32)}, adapter_config=config())
    with pytest.raises(AdapterError) as caught:
        validate(directory, LIMITS)
    assert "\n" not in caught.value.message and "\x1b" not in caught.value.message
    assert "\\n" in caught.value.message and "\\x1b" in caught.value.message
    assert json.dumps(caught.value.message)  # and it goes into a status patch as it is


def test_a_header_longer_than_the_base_model_could_need_is_refused_unparsed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing a JSON header takes several times its size: one no real adapter of this base model could have is
    refused from its length alone (a 12.9 MB header of 100,000 tensors took ~60 MB to parse)."""
    from moelora.agent.check import safetensors_header

    directory = adapter(tmp_path / "a", weights=many_tensors(100_000), adapter_config=config())
    limits = dataclasses.replace(LIMITS, base_config=base_config(tmp_path / "base", LLAMA))
    monkeypatch.setattr(safetensors_header, "parse", lambda *a, **k: pytest.fail("parsed"))
    with pytest.raises(AdapterError) as caught:
        validate(directory, limits)
    assert caught.value.reason is FailureReason.WEIGHTS_MISMATCH and "bytes" in caught.value.message


@pytest.mark.integration  # parses a header of many MB
def test_a_large_header_gives_its_memory_back(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moelora.agent.check import validate as module

    released = []
    monkeypatch.setattr(module, "release_memory", lambda: released.append(True))
    directory = adapter(tmp_path / "a", weights=many_tensors(100_000), adapter_config=config())
    with pytest.raises(AdapterError):
        validate(directory, LIMITS)  # no base model: parsed, then refused
    assert released == [True]
    validate(adapter(tmp_path / "b", weights=attention(), adapter_config=config()), LIMITS)
    assert released == [True]  # a small header is not worth a trim


@pytest.mark.integration  # parses a header of many MB
def test_a_kept_refusal_does_not_keep_the_parsed_header(tmp_path: pathlib.Path) -> None:
    """The agent keeps each adapter's refusal; a traceback through the parser would keep its parsed header too."""
    from moelora.agent.check.safetensors_header import Header

    directory = adapter(tmp_path / "a", weights=many_tensors(100_000), adapter_config=config())
    with pytest.raises(AdapterError) as caught:
        validate(directory, LIMITS)  # parsed, then refused by the tensor checks
    frames, trace = [], caught.value.__traceback__
    while trace is not None:
        frames.append(trace.tb_frame)
        trace = trace.tb_next
    assert "check_weights" in [f.f_code.co_name for f in frames]
    held = [name for f in frames for name, value in f.f_locals.items() if isinstance(value, Header)]
    assert not held and not [f for f in frames if f.f_code.co_name in ("parse", "pairs")]
