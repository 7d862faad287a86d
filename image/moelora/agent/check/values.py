"""Every tensor's values checked before vLLM sees them: finite, and no larger than a bound, read from disk in chunks
so memory never holds more than one chunk of a file (an adapter can be gigabytes).

The tests work on the raw words, with no float conversion: a float is NaN or Inf when its exponent bits are all
ones, and |w| > bound when its bits without the sign, read as an unsigned integer, exceed those of the largest value
of its dtype that is <= bound (IEEE floats of one sign order like their bit patterns). The bound is MAX_MAGNITUDE on
every stored value, and on lora_B times the adapter's largest scaling, which is what vLLM multiplies lora_B by when
it loads it; docs/architecture.md ("Values") says why that number. Refusals: WeightsNonFinite (NaN or Inf) and
WeightsOutOfRange (finite, over the bound), each naming the first such tensor in the file, the element and its value.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import pathlib
import struct
import threading
from typing import Any

import numpy as np

from moelora.agent.check.safetensors_header import Header, TensorInfo
from moelora.agent.errors import AdapterError, quote
from moelora.api import FailureReason

MAX_MAGNITUDE = 1e4
CHUNK = 1 << 20  # bytes read at a time: a multiple of every item size
PEFT_DEFAULT_ALPHA = 8  # peft's LoraConfig.lora_alpha default

WORD: dict[str, np.dtype[Any]] = {"F32": np.dtype("<u4"), "F16": np.dtype("<u2"), "BF16": np.dtype("<u2")}
_MAGNITUDE = {"F32": 0x7FFFFFFF, "F16": 0x7FFF, "BF16": 0x7FFF}
_INF = {"F32": 0x7F800000, "F16": 0x7C00, "BF16": 0x7F80}  # exponent all ones: this or above is Inf or NaN
_F32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]
_F16_MAX = 65504.0


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The largest |w| allowed in lora_A and in lora_B tensors."""

    a: float
    b: float

    def of(self, name: str) -> float:
        return self.b if ".lora_B." in name else self.a


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def max_scaling(config: dict[str, Any]) -> float:
    """The largest |scaling| any module of the adapter may get (peft's alpha/r, or alpha/sqrt(r) with rsLoRA, over r,
    lora_alpha and their patterns); AdapterError(ConfigInvalid) if an alpha is not a finite number. `config` has
    passed the rank checks. No pattern is matched against a module (a tenant's regex), so this is an upper bound."""
    alphas = [config.get("lora_alpha", PEFT_DEFAULT_ALPHA)]
    pattern = config.get("alpha_pattern") or {}
    if not isinstance(pattern, dict):
        raise AdapterError(FailureReason.CONFIG_INVALID, "'alpha_pattern' must map module names to numbers")
    alphas += list(pattern.values())
    bad = [a for a in alphas if not _number(a)]
    if bad:
        raise AdapterError(
            FailureReason.CONFIG_INVALID, f"lora_alpha and alpha_pattern must be finite numbers, got {quote(bad[0])}"
        )
    ranks = [config["r"], *(config.get("rank_pattern") or {}).values()]
    smallest = min(ranks)
    divisor = math.sqrt(smallest) if config.get("use_rslora") else smallest
    return max(abs(a) for a in alphas) / divisor


def bounds(config: dict[str, Any]) -> Bounds:
    """MAX_MAGNITUDE on every stored value and on lora_B times the largest scaling (what vLLM computes at load)."""
    return Bounds(a=MAX_MAGNITUDE, b=MAX_MAGNITUDE / max(max_scaling(config), 1.0))


def limit_bits(dtype: str, bound: float) -> int:
    """The magnitude bits of the largest finite `dtype` value that is <= `bound` (>= 0)."""
    if dtype == "F16":
        if bound >= _F16_MAX:
            return 0x7BFF
        bits = struct.unpack("<H", struct.pack("<e", bound))[0]  # rounded to nearest: one step down if above
        return bits - 1 if struct.unpack("<e", struct.pack("<H", bits))[0] > bound else bits
    if bound >= _F32_MAX:
        bits = 0x7F7FFFFF
    else:
        bits = struct.unpack("<I", struct.pack("<f", bound))[0]
        if struct.unpack("<f", struct.pack("<I", bits))[0] > bound:
            bits -= 1
    return bits >> 16 if dtype == "BF16" else bits  # bf16 is f32's top half: dropping bits rounds toward zero


def decode(dtype: str, word: int) -> float:
    if dtype == "F32":
        return float(struct.unpack("<f", struct.pack("<I", word))[0])
    if dtype == "F16":
        return float(struct.unpack("<e", struct.pack("<H", word))[0])
    return float(struct.unpack("<f", struct.pack("<I", word << 16))[0])


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return index[::-1]


def refusal(*, name: str, dtype: str, shape: tuple[int, ...], flat: int, word: int, bound: float) -> AdapterError:
    """The refusal of tensor `name` whose element `flat` (in row-major order) is the raw `word` over `bound`."""
    where = f"tensor {quote(name)} holds {decode(dtype, word):.7g} at {_index(flat, shape)}"
    if word & _MAGNITUDE[dtype] >= _INF[dtype]:
        return AdapterError(FailureReason.WEIGHTS_NON_FINITE, f"{where}: weights must be finite")
    if ".lora_B." not in name:
        return AdapterError(FailureReason.WEIGHTS_OUT_OF_RANGE, f"{where}: values must be within +-{MAX_MAGNITUDE:g}")
    return AdapterError(
        FailureReason.WEIGHTS_OUT_OF_RANGE,
        f"{where}: lora_B values, and lora_B times the adapter's largest scaling, must be within "
        f"+-{MAX_MAGNITUDE:g} (|w| <= {bound:.6g} here)",
    )


def first_over(words: np.ndarray, dtype: str, limit: int, scratch: np.ndarray | None = None) -> int | None:
    """The flat index of the first word whose magnitude bits exceed `limit`, or None; `words` is any array of
    WORD[dtype], `scratch` an optional contiguous array of its size to compute in."""
    magnitude = np.bitwise_and(words, _MAGNITUDE[dtype], out=scratch)
    if magnitude.size == 0 or int(magnitude.max()) <= limit:
        return None
    return int(np.argmax(magnitude.reshape(-1) > limit))


def check_array(words: np.ndarray, *, name: str, dtype: str, bound: float) -> None:
    """The same checks on a tensor in memory (raw words of its dtype, any shape); AdapterError if it fails."""
    flat = first_over(words, dtype, limit_bits(dtype, bound))
    if flat is not None:
        word = int(words.reshape(-1)[flat])
        raise refusal(name=name, dtype=dtype, shape=tuple(words.shape), flat=flat, word=word, bound=bound)


@dataclasses.dataclass(frozen=True)
class _Piece:
    tensor: TensorInfo
    begin: int  # byte range within the data region
    end: int


def _batches(tensors: list[TensorInfo]) -> list[list[_Piece]]:
    """The data region, in file order, as reads of at most CHUNK bytes of one dtype, each a list of pieces of
    tensors (a tensor over CHUNK spans several reads)."""
    batches: list[list[_Piece]] = []
    current: list[_Piece] = []
    size = 0
    for tensor in tensors:
        position = tensor.begin
        while position < tensor.end:
            if current and (current[0].tensor.dtype != tensor.dtype or size == CHUNK):
                batches.append(current)
                current, size = [], 0
            end = min(tensor.end, position + CHUNK - size)
            current.append(_Piece(tensor, position, end))
            size += end - position
            position = end
    if current:
        batches.append(current)
    return batches


_checked: collections.OrderedDict[tuple[Any, ...], None] = collections.OrderedDict()
_checked_lock = threading.Lock()
_CHECKED_MAX = 4096  # files remembered as good; an entry is a short tuple


def check(path: pathlib.Path, header: Header, limits: Bounds) -> None:
    """Every tensor of the safetensors file at `path` (whose parsed header is `header`) finite and within
    `limits`; AdapterError naming the first that is not. A file found good is not read again while its inode,
    size and mtime stay the same (cache entries never change, and the periodic re-check would read them all)."""
    stat = path.stat()
    key = (str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, limits)
    with _checked_lock:
        if key in _checked:
            _checked.move_to_end(key)
            return
    _scan(path, header, limits, data_start=stat.st_size - header.data_bytes)
    with _checked_lock:
        _checked[key] = None
        while len(_checked) > _CHECKED_MAX:
            _checked.popitem(last=False)


def _scan(path: pathlib.Path, header: Header, limits: Bounds, *, data_start: int) -> None:
    tensors = sorted(header.tensors.values(), key=lambda t: t.begin)
    limits_of = {t.name: limit_bits(t.dtype, limits.of(t.name)) for t in tensors}
    buffer = bytearray(CHUNK)
    scratch = {dtype: np.empty(CHUNK // word.itemsize, word) for dtype, word in WORD.items()}
    with path.open("rb", buffering=0) as stream:
        stream.seek(data_start)
        for batch in _batches(tensors):
            dtype = batch[0].tensor.dtype
            size = batch[-1].end - batch[0].begin
            view = memoryview(buffer)[:size]
            got = 0
            while got < size:  # a raw read may return less than asked
                count = stream.readinto(view[got:])
                if not count:
                    raise AdapterError(FailureReason.WEIGHTS_INVALID, f"{path.name} ended while its values were read")
                got += count
            item = WORD[dtype].itemsize
            words = np.frombuffer(buffer, WORD[dtype], count=size // item)
            magnitude = np.bitwise_and(words, _MAGNITUDE[dtype], out=scratch[dtype][: size // item])
            if int(magnitude.max()) <= min(limits_of[p.tensor.name] for p in batch):
                continue
            for piece in batch:
                lo, hi = (piece.begin - batch[0].begin) // item, (piece.end - batch[0].begin) // item
                limit = limits_of[piece.tensor.name]
                flat = first_over(words[lo:hi], dtype, limit)
                if flat is not None:
                    tensor = piece.tensor
                    raise refusal(
                        name=tensor.name,
                        dtype=dtype,
                        shape=tensor.shape,
                        flat=(piece.begin - tensor.begin) // item + flat,
                        word=int(words[lo + flat]),
                        bound=limits.of(tensor.name),
                    )
