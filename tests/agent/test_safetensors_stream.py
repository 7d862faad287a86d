"""The streaming safetensors writer: files safetensors itself reads back, and refusals of out-of-plan tensors."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from moelora.agent.check.safetensors_stream import TensorSpec, write


def test_round_trip_in_any_laid_out_order(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    bf16 = torch.randn(2, 7).to(torch.bfloat16)
    arrays = {
        "z.first": rng.standard_normal((3, 5)).astype(np.float32),
        "a.second": bf16.view(torch.int16).numpy().view(np.uint16),  # numpy has no bf16: its raw words
        "m.third": np.ascontiguousarray(rng.standard_normal((4, 4))[:, ::2]),
        "b.fourth": rng.standard_normal(1).astype(np.float16),
    }
    dtypes = {"z.first": "F32", "a.second": "BF16", "m.third": "F64", "b.fourth": "F16"}
    specs = [TensorSpec(name, dtypes[name], tuple(a.shape)) for name, a in arrays.items()]
    path = tmp_path / "out.safetensors"
    write(path, specs, iter(arrays.items()), metadata={"format": "pt"})
    loaded = load_file(str(path))
    assert set(loaded) == set(arrays)
    assert torch.equal(loaded["a.second"], bf16)
    for name in ("z.first", "m.third", "b.fourth"):
        assert torch.equal(loaded[name], torch.from_numpy(arrays[name]))
    with safe_open(str(path), framework="pt") as reader:
        assert reader.metadata() == {"format": "pt"}
    assert (int.from_bytes(path.read_bytes()[:8], "little") + 8) % 8 == 0


@pytest.mark.parametrize(
    "tensors",
    [
        [("b", np.zeros(2, np.float32))],  # not the next laid out
        [("a", np.zeros(3, np.float32))],  # wrong shape
        [("a", np.zeros((1, 2), np.float32))],  # same bytes, another shape
        [("a", np.zeros(2, np.float16))],  # wrong item size
        [("a", np.zeros(4, np.float32)[::2])],  # not contiguous
        [("a", np.zeros(2, np.float32))],  # "b" never written
        [("a", np.zeros(2, np.float32)), ("b", np.zeros(1, np.float32)), ("c", np.zeros(1, np.float32))],  # extra
        [("a", np.zeros(2, np.int64))],  # 8-byte items for a 4-byte dtype
    ],
)
def test_refuses_tensors_that_break_the_layout(tmp_path: pathlib.Path, tensors: list) -> None:
    specs = [TensorSpec("a", "F32", (2,)), TensorSpec("b", "F32", (1,))]
    with pytest.raises(ValueError):
        write(tmp_path / "out.safetensors", specs, tensors)


def test_refuses_a_name_twice(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        write(tmp_path / "out.safetensors", [TensorSpec("a", "F32", (1,))] * 2, [])
