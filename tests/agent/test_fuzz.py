"""Property tests: whatever bytes a tenant uploads, the header parser, the config parser and the tensor checks
either return a result or raise the agent's own AdapterError with a reason; nothing else escapes."""

from __future__ import annotations

import json
import random
import struct
import threading
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moelora.agent.check import safetensors_header, tensors
from moelora.agent.check.basemodel import from_config
from moelora.agent.check.validate import Limits, check_config, parse_config
from moelora.agent.errors import AdapterError
from moelora.api import FailureReason

from .conftest import BASE_MODEL
from .hostile import LLAMA, QWEN3_MOE, entry, raw

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = Limits(base_model=BASE_MODEL, max_rank=16, target_modules=frozenset(), max_bytes=1 << 20)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
names = st.sampled_from(
    [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
        "base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight",
        "base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight",
        "__metadata__",
    ]
) | st.text(max_size=30)
dims = st.integers(min_value=-2, max_value=70)
entries = st.builds(
    entry,
    st.sampled_from(["F32", "F16", "BF16", "I64", "BOOL", "X"]),
    st.lists(dims, max_size=3),
    st.integers(min_value=-4, max_value=600),
    st.integers(min_value=-4, max_value=600),
)
headers = st.dictionaries(names, entries | json_values, max_size=6)


def _ok_or_adapter_error(call: Any) -> Any:
    try:
        return call()
    except AdapterError as error:
        assert isinstance(error.reason, FailureReason) and error.message.isprintable()
        return None


@FAST
@given(st.binary(max_size=300))
def test_header_parser_on_arbitrary_bytes(data: bytes) -> None:
    _ok_or_adapter_error(lambda: safetensors_header.parse(data))


@FAST
@given(headers, st.binary(max_size=600), st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1)))
def test_header_parser_on_arbitrary_json_headers(header: dict[str, Any], data: bytes, length: int | None) -> None:
    _ok_or_adapter_error(lambda: safetensors_header.parse(raw(header, data, length=length)))


@FAST
@given(headers, st.binary(max_size=600), json_values, st.sampled_from([None, LLAMA, QWEN3_MOE]))
def test_tensor_checks_on_arbitrary_headers_and_configs(
    header: dict[str, Any], data: bytes, extra: Any, model: dict[str, Any] | None
) -> None:
    config = {"r": 8, "target_modules": ["q_proj", "gate_proj"], "base_model_name_or_path": BASE_MODEL}
    if isinstance(extra, dict):
        config.update(extra)

    def check() -> None:
        parsed = safetensors_header.parse(raw(header, data))
        check_config(config, LIMITS)
        tensors.check(parsed, config, allowed=frozenset(), base=from_config(model) if model else None)

    _ok_or_adapter_error(check)


@FAST
@given(st.binary(max_size=300))
def test_config_parser_on_arbitrary_bytes(data: bytes) -> None:
    _ok_or_adapter_error(lambda: check_config(parse_config(data), LIMITS))


@FAST
@given(json_values)
def test_config_checks_on_arbitrary_json(value: Any) -> None:
    text = json.dumps(value).encode()
    _ok_or_adapter_error(lambda: check_config(parse_config(text), LIMITS))


@FAST
@given(st.dictionaries(st.sampled_from(["r", "target_modules", "rank_pattern", "peft_type", "use_dora"]), json_values))
def test_config_checks_on_arbitrary_peft_fields(fields: dict[str, Any]) -> None:
    config = {"base_model_name_or_path": BASE_MODEL, **fields}
    _ok_or_adapter_error(lambda: check_config(parse_config(json.dumps(config).encode()), LIMITS))


def _tiled(layout: list[tuple[str, str, list[int]]]) -> bytes:
    """A safetensors file whose ranges tile the data region, so the tensor checks see every layout."""
    header, position = {}, 0
    for name, dtype, shape in layout:
        size = safetensors_header.ITEMSIZE[dtype]
        for dim in shape:
            size *= dim
        header[name] = entry(dtype, shape, position, position + size)
        position += size
    return raw(header, b"\0" * position)


modules = st.sampled_from(
    [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.self_attn.v_proj",
        "model.layers.2.self_attn.q_proj",
        "model.layers.0.mlp.gate_proj",
        "model.layers.1.mlp.experts.3.gate_proj",
        "model.layers.0.mlp.experts.9.down_proj",
        "model.layers.0.mlp.experts",
        "model.layers.0.mlp.experts.base_layer",
        "model.layers.0.mlp.gate",
        "lm_head",
    ]
)
layouts = st.lists(
    st.tuples(
        st.builds(lambda m, k: f"base_model.model.{m}.{k}.weight", modules, st.sampled_from(["lora_A", "lora_B"])),
        st.sampled_from(["F32", "BF16"]),
        st.lists(st.sampled_from([0, 1, 7, 8, 16, 32, 64, 100]), min_size=1, max_size=3),
    ),
    max_size=8,
    unique_by=lambda t: t[0],
)


@FAST
@given(layouts, st.sampled_from([None, LLAMA, QWEN3_MOE]), st.sampled_from([{}, {"rank_pattern": {"v_proj": 4}}]))
def test_tensor_checks_on_well_framed_files(
    layout: list[tuple[str, str, list[int]]], model: dict[str, Any] | None, extra: dict[str, Any]
) -> None:
    config = {
        "r": 8,
        "target_modules": ["q_proj", "v_proj", "gate_proj", "down_proj", "gate", "lm_head"],
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        "base_model_name_or_path": BASE_MODEL,
        **extra,
    }

    def check() -> None:
        parsed = safetensors_header.parse(_tiled(layout))
        tensors.check(
            parsed, config, allowed=frozenset({"q_proj", "v_proj"}), base=from_config(model) if model else None
        )

    _ok_or_adapter_error(check)


def test_a_well_formed_header_parses_with_the_library_agreeing() -> None:
    import numpy as np
    import safetensors.numpy

    arrays = {"b": np.ones((3, 5), np.float16), "a": np.zeros((2, 4), np.float32), "e": np.zeros((0, 7), np.float32)}
    data = safetensors.numpy.save(arrays, metadata={"format": "pt"})
    header = safetensors_header.parse(data)
    assert {n: t.shape for n, t in header.tensors.items()} == {n: a.shape for n, a in arrays.items()}
    assert header.metadata == {"format": "pt"}
    assert header.data_bytes == len(data) - 8 - struct.unpack("<Q", data[:8])[0]


def test_a_thread_drawing_from_the_global_random_does_not_fail_a_property_test() -> None:
    """Other tests' threads in the same worker (botocore's retry jitter, s3transfer's temporary names) draw from the
    global generator while Hypothesis draws; CI failed on that once, with strategies that never touch `random`."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            random.random()

    @settings(max_examples=200, deadline=None, database=None)
    @given(json_values)
    def draws(value: Any) -> None:
        json.dumps(value)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        draws()
    finally:
        stop.set()
        thread.join(timeout=5)
