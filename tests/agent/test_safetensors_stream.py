"""The streaming safetensors writer: files safetensors itself reads back, and refusals of out-of-plan tensors."""

from __future__ import annotations

import pathlib

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from moelora.agent.safetensors_stream import TensorSpec, write


def test_round_trip_in_any_laid_out_order(tmp_path: pathlib.Path) -> None:
    tensors = {
        "z.first": torch.randn(3, 5),
        "a.second": torch.randn(2, 7).to(torch.bfloat16),
        "m.third": torch.randn(4, 4, dtype=torch.float64)[:, ::2],  # a strided view is written contiguously
        "b.fourth": torch.randn(1).to(torch.float16),
    }
    dtypes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float64: "F64", torch.float16: "F16"}
    specs = [TensorSpec(name, dtypes[t.dtype], tuple(t.shape)) for name, t in tensors.items()]
    path = tmp_path / "out.safetensors"
    write(path, specs, iter(tensors.items()), metadata={"format": "pt"})
    loaded = load_file(str(path))
    assert set(loaded) == set(tensors)
    assert all(torch.equal(loaded[name], t) for name, t in tensors.items())
    with safe_open(str(path), framework="pt") as reader:
        assert reader.metadata() == {"format": "pt"}
    assert (int.from_bytes(path.read_bytes()[:8], "little") + 8) % 8 == 0


@pytest.mark.parametrize(
    "tensors",
    [
        [("b", torch.zeros(2))],  # not the next laid out
        [("a", torch.zeros(3))],  # wrong shape
        [("a", torch.zeros(2, dtype=torch.float16))],  # wrong dtype
        [("a", torch.zeros(2))],  # "b" never written
        [("a", torch.zeros(2)), ("b", torch.zeros(1)), ("c", torch.zeros(1))],  # more than laid out
        [("a", torch.zeros(2, dtype=torch.int64))],  # not a float tensor
    ],
)
def test_refuses_tensors_that_break_the_layout(tmp_path: pathlib.Path, tensors: list) -> None:
    specs = [TensorSpec("a", "F32", (2,)), TensorSpec("b", "F32", (1,))]
    with pytest.raises(ValueError):
        write(tmp_path / "out.safetensors", specs, tensors)


def test_refuses_a_name_twice(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        write(tmp_path / "out.safetensors", [TensorSpec("a", "F32", (1,))] * 2, [])
