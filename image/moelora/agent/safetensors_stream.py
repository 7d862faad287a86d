"""Write a safetensors file one tensor at a time: the header is laid out from the tensors' specs first, so memory
holds only the tensor being written, never the whole file (an adapter can be gigabytes)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import struct
from collections.abc import Iterable, Sequence
from typing import Any

# safetensors' names for the dtypes adapters are stored in.
DTYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
_ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
_ALIGN = 8  # safetensors pads its header so the data starts 8-byte aligned


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # safetensors' name: F32, F16, BF16, F64
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * _ITEM_BYTES[self.dtype]


def dtype_name(tensor: Any) -> str:
    """safetensors' dtype name of a torch tensor; ValueError for dtypes an adapter has no business holding."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise ValueError(f"unsupported tensor dtype {name}")
    return DTYPE_NAMES[name]


def _header(specs: Sequence[TensorSpec], metadata: dict[str, str] | None) -> bytes:
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for spec in specs:
        if spec.name in header:
            raise ValueError(f"tensor {spec.name!r} is written twice")
        header[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % _ALIGN)


def write(
    path: pathlib.Path,
    specs: Sequence[TensorSpec],
    tensors: Iterable[tuple[str, Any]],
    *,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write `tensors` (name, torch tensor), which must come exactly in `specs`' order and match them, to `path`."""
    header = _header(specs, metadata)
    expected = iter(specs)
    with path.open("wb") as stream:
        stream.write(struct.pack("<Q", len(header)))
        stream.write(header)
        for name, tensor in tensors:
            spec = next(expected, None)
            if spec is None or spec.name != name:
                raise ValueError(f"tensor {name!r} is not the next one laid out ({spec.name if spec else 'none'})")
            if tuple(tensor.shape) != spec.shape or dtype_name(tensor) != spec.dtype:
                raise ValueError(f"tensor {name!r} is {tuple(tensor.shape)} {tensor.dtype}, laid out as {spec}")
            stream.write(tensor.contiguous().reshape(-1).view(_byte_dtype()).numpy().tobytes())
        missing = next(expected, None)
        if missing is not None:
            raise ValueError(f"tensor {missing.name!r} was laid out but never written")


def _byte_dtype() -> Any:
    import torch

    return torch.uint8
