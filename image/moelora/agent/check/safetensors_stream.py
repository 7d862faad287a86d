"""Write a safetensors file one tensor at a time: the header is laid out from the tensors' specs first, so memory
holds only the tensor being written, never the whole file (an adapter can be gigabytes)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import struct
from collections.abc import Iterable, Sequence
from typing import Any

ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
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
        return count * ITEM_BYTES[self.dtype]


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
    """Write `tensors` (name, array), which must come exactly in `specs`' order and match them, to `path`. An array is
    anything with the buffer protocol (a numpy array), C-contiguous, of the spec's shape and item size: bf16 comes
    as its raw 16-bit words, since numpy has no bf16."""
    header = _header(specs, metadata)
    expected = iter(specs)
    with path.open("wb") as stream:
        stream.write(struct.pack("<Q", len(header)))
        stream.write(header)
        for name, tensor in tensors:
            spec = next(expected, None)
            if spec is None or spec.name != name:
                raise ValueError(f"tensor {name!r} is not the next one laid out ({spec.name if spec else 'none'})")
            view = memoryview(tensor)
            if tuple(view.shape or ()) != spec.shape or view.itemsize != ITEM_BYTES[spec.dtype]:
                raise ValueError(
                    f"tensor {name!r} is {tuple(view.shape or ())} of {view.itemsize}-byte items, laid out as {spec}"
                )
            if not view.c_contiguous:
                raise ValueError(f"tensor {name!r} is not contiguous")
            stream.write(view.cast("B"))
        missing = next(expected, None)
        if missing is not None:
            raise ValueError(f"tensor {missing.name!r} was laid out but never written")
