"""Every tensor's values checked before vLLM sees them: NaN, Inf and magnitudes over the bound, in F32, F16 and BF16,
found wherever they sit in the file (chunk edges included) and named in the refusal."""

from __future__ import annotations

import os
import pathlib
import struct
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from moelora.agent.check import safetensors_header, values
from moelora.agent.check.safetensors_stream import TensorSpec, write
from moelora.agent.errors import AdapterError
from moelora.api import FailureReason

A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
V_A = "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"
LIMITS = values.Bounds(a=1e4, b=5e3)


def bf16_words(array: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 words, rounded to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def save(path: pathlib.Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> pathlib.Path:
    """A safetensors file of `tensors` (float32 values) stored as `dtype`, in the dict's order."""
    stored = {
        name: bf16_words(t) if dtype == "BF16" else t.astype(np.float16 if dtype == "F16" else np.float32)
        for name, t in tensors.items()
    }
    write(path, [TensorSpec(n, dtype, t.shape) for n, t in stored.items()], stored.items())
    return path


def check(path: pathlib.Path, limits: values.Bounds = LIMITS) -> None:
    values.check(path, safetensors_header.read(path), limits)


def refusal(path: pathlib.Path, limits: values.Bounds = LIMITS) -> AdapterError:
    with pytest.raises(AdapterError) as caught:
        check(path, limits)
    return caught.value


def small(**poison: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tensors = {
        A: rng.uniform(-0.2, 0.2, (8, 32)).astype(np.float32),
        B: rng.normal(0, 0.01, (32, 8)).astype(np.float32),
        V_A: rng.uniform(-0.2, 0.2, (8, 32)).astype(np.float32),
    }
    for name, index, value in poison.values():
        tensors[name][index] = value
    return tensors


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_good_weights_pass_in_every_dtype(tmp_path: pathlib.Path, dtype: str) -> None:
    check(save(tmp_path / "w.safetensors", small(), dtype))


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_in_the_second_tensor_is_named(tmp_path: pathlib.Path, dtype: str, value: float) -> None:
    error = refusal(save(tmp_path / "w.safetensors", small(p=(B, (3, 4), value)), dtype))
    assert error.reason is FailureReason.WEIGHTS_NON_FINITE
    assert f"tensor {B!r} holds {value:.7g} at [3, 4]" in error.message


@pytest.mark.parametrize(("dtype", "value"), [("F32", 1e30), ("BF16", -1e30), ("F32", 10001.0), ("F16", 20000.0)])
def test_finite_values_over_the_bound_are_out_of_range(tmp_path: pathlib.Path, dtype: str, value: float) -> None:
    error = refusal(save(tmp_path / "w.safetensors", small(p=(V_A, (7, 31), value)), dtype))
    assert error.reason is FailureReason.WEIGHTS_OUT_OF_RANGE
    assert f"tensor {V_A!r} holds" in error.message and "at [7, 31]" in error.message


def test_lora_b_has_its_own_bound(tmp_path: pathlib.Path) -> None:
    check(save(tmp_path / "ok.safetensors", small(p=(B, (0, 0), 5000.0), q=(A, (0, 0), 9999.0))))
    error = refusal(save(tmp_path / "over.safetensors", small(p=(B, (0, 0), 5001.0))))
    assert error.reason is FailureReason.WEIGHTS_OUT_OF_RANGE and "|w| <= 5000 here" in error.message


def test_the_first_bad_tensor_in_the_file_is_named(tmp_path: pathlib.Path) -> None:
    tensors = small(p=(V_A, (0, 0), np.nan), q=(A, (1, 1), 1e30))
    path = save(tmp_path / "w.safetensors", {V_A: tensors[V_A], A: tensors[A], B: tensors[B]})
    error = refusal(path)
    assert error.reason is FailureReason.WEIGHTS_NON_FINITE and V_A in error.message


@pytest.mark.parametrize("offset", [0, 1, -1])
def test_values_at_chunk_edges_are_found(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, offset: int) -> None:
    """Tensors that straddle reads, and a tensor of several reads: a NaN just before, at and after an edge."""
    monkeypatch.setattr(values, "CHUNK", 4096)
    rng = np.random.default_rng(1)
    tensors = {
        f"base_model.model.m{i}.lora_A.weight": rng.normal(0, 0.1, (3, 37)).astype(np.float32) for i in range(40)
    }
    tensors[A] = rng.normal(0, 0.1, (64, 100)).astype(np.float32)  # 25,600 bytes: seven reads
    path = save(tmp_path / "good.safetensors", tensors, "BF16")
    check(path)
    header = safetensors_header.read(path)
    info = header.tensors[A]
    edge = ((info.begin // 4096) + 3) * 4096  # a read boundary inside A, in data bytes
    element = (edge - info.begin) // 2 + offset
    tensors[A].flat[element] = np.nan
    error = refusal(save(tmp_path / "bad.safetensors", tensors, "BF16"))
    assert error.reason is FailureReason.WEIGHTS_NON_FINITE
    assert f"at {[element // 100, element % 100]}" in error.message


def test_a_file_changed_in_place_is_read_again(tmp_path: pathlib.Path) -> None:
    path = save(tmp_path / "w.safetensors", small())
    check(path)
    stat = path.stat()
    save(path, small(p=(B, (0, 0), np.nan)))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert refusal(path).reason is FailureReason.WEIGHTS_NON_FINITE


def test_a_good_file_is_read_once(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save(tmp_path / "w.safetensors", small())
    check(path)
    monkeypatch.setattr(values, "_scan", lambda *args, **kwargs: pytest.fail("read again"))
    check(path)


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
@pytest.mark.parametrize("bound", [0.0, 1e-30, 1e-3, 0.5, 5000.0, 1e4, 65504.0, 1e5, 1e39, float("inf")])
def test_the_bit_bound_is_exact_for_every_16_bit_word(dtype: str, bound: float) -> None:
    words = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        if dtype == "F16":
            floats = words.astype(np.uint16).view(np.float16).astype(np.float64)
        else:
            floats = (words << 16).view(np.float32).astype(np.float64)
    over = (words & 0x7FFF) > values.limit_bits(dtype, bound)
    assert np.array_equal(over, ~(np.isfinite(floats) & (np.abs(floats) <= bound)))


def test_the_bit_bound_is_exact_for_float32() -> None:
    rng = np.random.default_rng(2)
    words = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    with np.errstate(invalid="ignore"):
        floats = words.view(np.float32).astype(np.float64)
    for bound in (0.0, 1e-40, 0.25, 5000.0, 1e4, 3e38, 1e39, float("inf")):
        over = (words & 0x7FFFFFFF) > values.limit_bits("F32", bound)
        assert np.array_equal(over, ~(np.isfinite(floats) & (np.abs(floats) <= bound)))
    assert values.limit_bits("F32", 1e4) == struct.unpack("<I", struct.pack("<f", 1e4))[0]


@pytest.mark.parametrize(
    ("config", "scaling"),
    [
        ({"r": 8, "lora_alpha": 16}, 2.0),
        ({"r": 8}, 1.0),  # peft's default alpha is 8
        ({"r": 16, "lora_alpha": 64, "use_rslora": True}, 16.0),
        ({"r": 8, "lora_alpha": 8, "alpha_pattern": {"q_proj": -64}, "rank_pattern": {"v_proj": 2}}, 32.0),
    ],
)
def test_the_largest_scaling_is_an_upper_bound_over_patterns(config: dict[str, Any], scaling: float) -> None:
    assert values.max_scaling(config) == scaling
    assert values.bounds(config) == values.Bounds(a=1e4, b=1e4 / max(scaling, 1.0))


@pytest.mark.parametrize("alpha", ["16", None, True, float("inf"), float("nan")])
def test_an_alpha_that_is_not_a_finite_number_is_refused(alpha: Any) -> None:
    with pytest.raises(AdapterError) as caught:
        values.max_scaling({"r": 8, "lora_alpha": 8, "alpha_pattern": {"q_proj": alpha}})
    assert caught.value.reason is FailureReason.CONFIG_INVALID


def test_a_huge_alpha_refuses_any_nonzero_lora_b(tmp_path: pathlib.Path) -> None:
    limits = values.bounds({"r": 8, "lora_alpha": 1e30})
    zeros = {A: np.ones((8, 32), np.float32), B: np.zeros((32, 8), np.float32)}
    check(save(tmp_path / "zero.safetensors", zeros), limits)
    error = refusal(save(tmp_path / "w.safetensors", small()), limits)
    assert error.reason is FailureReason.WEIGHTS_OUT_OF_RANGE and B in error.message


def test_a_file_from_safetensors_itself_is_read_like_ours(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(safetensors.numpy.save(small(p=(A, (2, 2), -np.inf))))
    assert refusal(path).reason is FailureReason.WEIGHTS_NON_FINITE
