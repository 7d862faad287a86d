"""Our own reader of a safetensors file's header, strict enough for files a hostile tenant wrote.

The safetensors library is what such a file attacks, so it is not used for the check. The layout: an 8-byte
little-endian header length N, N bytes of a UTF-8 JSON object {name: {dtype, shape, data_offsets}, "__metadata__":
{str: str}}, then the data region, which the tensors' byte ranges must tile exactly (no overlap, gap or tail).
Every refusal is AdapterError(WeightsInvalid) naming the problem.
"""

from __future__ import annotations

import dataclasses
import pathlib
import struct
from typing import Any

from moelora.agent.check.strictjson import load_json
from moelora.agent.errors import AdapterError, quote
from moelora.api import FailureReason

MiB = 2**20
HEADER_LIMIT = 64 * MiB  # a header of MAX_TENSORS entries is well below this
MAX_TENSORS = 2**17  # the per-expert layout of the largest MoE we serve stays under it
MAX_NAME = 512
MAX_DIMS = 4
MAX_DEPTH = 4  # object -> tensor -> shape list is 3 levels
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}  # the float types LoRA weights are saved in
# Valid safetensors dtypes that are still refused here: named as such in the message rather than "unknown".
OTHER_DTYPES = {"F64", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}
METADATA = "__metadata__"


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte range in the data region
    end: int


@dataclasses.dataclass(frozen=True)
class Header:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_bytes: int


def _invalid(what: str, problem: str) -> AdapterError:
    return AdapterError(FailureReason.WEIGHTS_INVALID, f"{what}: {problem}")


def _sniff(head: bytes) -> str | None:
    """What a file that is not safetensors looks like, for a clearer message."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle bytes, not safetensors (loading a pickle can run code)"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (torch.save output), not safetensors"
    return None


def header_length(head: bytes, file_size: int, *, what: str) -> int:
    """The header length from the first 8 bytes, checked against the file and HEADER_LIMIT."""
    if file_size < 8 or len(head) < 8:
        raise _invalid(what, f"{file_size} bytes is too short for a safetensors header")
    (length,) = struct.unpack("<Q", head[:8])
    if length == 0:
        problem = "header length is 0"
    elif length > HEADER_LIMIT:
        problem = f"header length {length} is over the limit of {HEADER_LIMIT} bytes"
    elif length > file_size - 8:
        problem = f"header length {length} is larger than the file ({file_size} bytes)"
    else:
        return int(length)
    sniffed = _sniff(head)  # only now: a real header length may start with the same bytes as a pickle
    raise _invalid(what, f"holds {sniffed}" if sniffed else problem)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor(name: str, entry: Any, *, what: str, data_bytes: int) -> TensorInfo:
    if not name or len(name) > MAX_NAME or not (name.isascii() and name.isprintable()):
        raise _invalid(what, f"tensor name {quote(name)} is empty, too long or not printable ASCII")
    label = f"tensor {quote(name)}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _invalid(what, f"{label} must be an object of exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in ITEMSIZE:
        kind = "refused" if dtype in OTHER_DTYPES else "unknown"
        raise _invalid(what, f"{label} has {kind} dtype {quote(dtype)}; LoRA weights are {', '.join(ITEMSIZE)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_int(d) and d >= 0 for d in shape):
        raise _invalid(what, f"{label} has shape {quote(shape)}, not up to {MAX_DIMS} non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_int(o) for o in offsets)):
        raise _invalid(what, f"{label} has data_offsets {quote(offsets)}, not two integers")
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise _invalid(what, f"{label} has data_offsets {quote(offsets)} outside the data ({data_bytes} bytes)")
    numel = 1
    for dim in shape:
        numel *= dim
    if numel * ITEMSIZE[dtype] != end - begin:
        raise _invalid(
            what,
            f"{label}: shape {quote(shape)} of {dtype} needs {quote(numel * ITEMSIZE[dtype])} bytes, "
            f"its data_offsets span {end - begin}",
        )
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def parse(
    head: bytes, file_size: int | None = None, *, what: str = "weights", max_tensors: int = MAX_TENSORS
) -> Header:
    """The header of a safetensors file whose first bytes are `head` (all of it, or at least 8 + header length) and
    whose size is `file_size` (default: len(head)); AdapterError(WeightsInvalid) if anything is off."""
    file_size = len(head) if file_size is None else file_size
    length = header_length(head, file_size, what=what)
    raw = head[8 : 8 + length]
    if len(raw) != length:
        raise _invalid(what, f"header is cut short ({len(raw)} of {length} bytes)")
    if not raw.lstrip(b" \t\r\n").startswith(b"{"):
        raise _invalid(what, "header is not a JSON object")
    parsed = load_json(raw, what=f"{what}: header", max_depth=MAX_DEPTH, reason=FailureReason.WEIGHTS_INVALID)
    if not isinstance(parsed, dict):
        raise _invalid(what, f"header is a JSON {type(parsed).__name__}, not an object")
    metadata = parsed.pop(METADATA, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _invalid(what, f"{METADATA} must map strings to strings")
    if len(parsed) > max_tensors:
        raise _invalid(what, f"{len(parsed)} tensors, over the limit of {max_tensors}")
    data_bytes = file_size - 8 - length
    tensors = {name: _tensor(name, entry, what=what, data_bytes=data_bytes) for name, entry in parsed.items()}
    position = 0  # the ranges, in order, must tile the data region exactly
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin < position:
            raise _invalid(what, f"tensor {quote(info.name)} overlaps another (bytes {info.begin}-{info.end})")
        if info.begin > position:
            raise _invalid(what, f"{info.begin - position} bytes before tensor {quote(info.name)} belong to no tensor")
        position = info.end
    if position != data_bytes:
        raise _invalid(what, f"{data_bytes - position} trailing bytes after the last tensor")
    return Header(tensors=tensors, metadata=metadata, data_bytes=data_bytes)


def read(path: pathlib.Path, *, max_tensors: int = MAX_TENSORS) -> Header:
    """The header of the safetensors file at `path`, reading only the header's bytes."""
    size = path.stat().st_size
    with path.open("rb") as stream:
        head = stream.read(8)
        length = header_length(head, size, what=path.name)
        head += stream.read(length)
    return parse(head, size, what=path.name, max_tensors=max_tensors)
