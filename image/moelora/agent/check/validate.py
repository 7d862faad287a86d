"""Pre-flight checks of a downloaded adapter directory, before vLLM sees it. Pure: reads files, changes nothing.

Each refusal is an AdapterError with its own FailureReason, so the LoRAAdapter's status says exactly what is wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import threading
from typing import Any

from moelora.agent.check import basemodel, safetensors_header, targets, tensors, values
from moelora.agent.check.layout import CONFIG_FILE, CONFIG_LIMIT, UNSAFE_SUFFIXES, WEIGHTS_FILE
from moelora.agent.check.strictjson import load_json
from moelora.agent.errors import AdapterError, quote
from moelora.api import FailureReason


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """What this ModelServer can serve."""

    base_model: str
    max_rank: int
    target_modules: frozenset[str]  # empty: any
    max_bytes: int
    base_config: pathlib.Path | None = None  # the base model's config.json: module dims are checked when set


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdapterInfo:
    """What the adapter's own files say; goes to status.rank/baseModel/targetModules/sizeBytes."""

    rank: int
    base_model: str
    target_modules: tuple[str, ...]  # sorted; a single regex string stays one entry
    size_bytes: int | None = None  # None when refused on the config alone, before the weights were downloaded


def normalize_model_id(name: str) -> str:
    """A base model id compared leniently: case, surrounding space, a trailing slash and an hf:// scheme ignored."""
    name = name.strip().rstrip("/")
    name = name.removeprefix("hf://")
    return name.lower()


def same_base_model(ours: str, theirs: str) -> bool:
    return normalize_model_id(ours) == normalize_model_id(theirs)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


CONFIG_DEPTH = 10  # peft's configs nest 3 levels; loftq_config and friends a little more


def read_config(directory: pathlib.Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise AdapterError(FailureReason.CONFIG_MISSING, f"{CONFIG_FILE} is missing")
    if path.stat().st_size > CONFIG_LIMIT:
        raise AdapterError(FailureReason.CONFIG_INVALID, f"{CONFIG_FILE} is {path.stat().st_size} bytes, not a config")
    return parse_config(path.read_bytes())


def adapter_rank(config: dict[str, Any]) -> int:
    """The highest rank of any module: `r`, or a larger one from peft's per-module `rank_pattern`."""
    rank: Any = config.get("r")
    if not _positive_int(rank):
        raise AdapterError(FailureReason.CONFIG_INVALID, f"'r' must be a positive integer, got {quote(rank)}")
    pattern = config.get("rank_pattern") or {}
    if not isinstance(pattern, dict) or not all(_positive_int(v) for v in pattern.values()):
        raise AdapterError(FailureReason.CONFIG_INVALID, "'rank_pattern' must map module names to positive integers")
    return max([int(rank), *(int(v) for v in pattern.values())])


def adapter_target_modules(config: dict[str, Any]) -> tuple[str, ...]:
    modules = config.get("target_modules")
    if isinstance(modules, str) and modules:
        return (modules,)
    if isinstance(modules, list) and modules and all(isinstance(m, str) and m for m in modules):
        return tuple(sorted(set(modules)))
    raise AdapterError(
        FailureReason.CONFIG_INVALID, f"'target_modules' must be a non-empty list of module names, got {quote(modules)}"
    )


def directory_bytes(directory: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


def parse_config(text: bytes) -> dict[str, Any]:
    """adapter_config.json's bytes as a JSON object, or AdapterError(ConfigInvalid): also for hostile ones (too
    large, nested too deep, integers of thousands of digits)."""
    if len(text) > CONFIG_LIMIT:
        raise AdapterError(FailureReason.CONFIG_INVALID, f"{CONFIG_FILE} is {len(text)} bytes, not a config")
    config = load_json(text, what=CONFIG_FILE, max_depth=CONFIG_DEPTH, reason=FailureReason.CONFIG_INVALID)
    if not isinstance(config, dict):
        raise AdapterError(FailureReason.CONFIG_INVALID, f"{CONFIG_FILE} is not a JSON object")
    return config


# peft's initialisations that only set the starting weights; the others (PiSSA, OLoRA, CorDA, LoftQ) change the base
# model's weights, so the adapter is wrong on the base model served. vLLM 0.32's PEFTHelper accepts these too.
PLAIN_INITS = frozenset({"gaussian", "eva", "orthogonal", "mica", "lora_ga"})


def unsupported_features(config: dict[str, Any]) -> list[str]:
    """The peft features in the config that vLLM does not serve (vLLM's PEFTHelper refuses each at load time)."""
    found = []
    saved = config.get("modules_to_save")
    if saved:
        found.append(
            f"modules_to_save {quote(saved)} (vLLM serves none for a generative model: it has no full-weight "
            "modules in an adapter)"
        )
    if config.get("use_dora"):
        found.append("DoRA (use_dora)")
    if config.get("lora_bias"):
        found.append("LoRA bias (lora_bias)")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in PLAIN_INITS:
        found.append(f"init_lora_weights {quote(init)} (it changes the base model's weights)")
    if config.get("alora_invocation_tokens"):
        found.append("Activated LoRA (alora_invocation_tokens)")
    if config.get("layer_replication"):
        found.append("layer_replication")
    if config.get("use_bdlora"):
        found.append("block-diagonal LoRA (use_bdlora)")
    if config.get("use_qalora"):
        found.append("QALoRA (use_qalora)")
    return found


def check_config(config: dict[str, Any], limits: Limits) -> tuple[int, str, tuple[str, ...]]:
    """(rank, base model, target modules) if the config is one this server can serve; else AdapterError.

    Runs twice: on the config alone before the weights are downloaded (a 1 GB adapter of the wrong rank fails in
    milliseconds), and again on the downloaded directory.
    """
    peft_type = config.get("peft_type", "LORA")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise AdapterError(FailureReason.CONFIG_INVALID, f"peft_type is {quote(peft_type)}, only LORA is served")
    features = unsupported_features(config)
    if features:
        raise AdapterError(FailureReason.UNSUPPORTED_FEATURE, f"vLLM does not serve {'; '.join(features)}")
    rank = adapter_rank(config)
    modules = adapter_target_modules(config)
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise AdapterError(
            FailureReason.BASE_MODEL_MISMATCH,
            f"{CONFIG_FILE} names no base_model_name_or_path; this server serves {quote(limits.base_model)}",
        )
    try:
        if rank > limits.max_rank:
            raise AdapterError(
                FailureReason.RANK_TOO_HIGH, f"rank {quote(rank)} is above this server's maxLoraRank {limits.max_rank}"
            )
        if not same_base_model(limits.base_model, base):
            raise AdapterError(
                FailureReason.BASE_MODEL_MISMATCH,
                f"trained on {quote(base)}, this server serves {quote(limits.base_model)}",
            )
        values.max_scaling(config)  # every alpha a finite number
        targets.check(
            config["target_modules"], base=basemodel.for_checks(limits.base_config), allowed=limits.target_modules
        )
        targets.check_parameters(config.get("target_parameters"), allowed=limits.target_modules)
    except AdapterError as error:  # the status shows what was read, so a refused rank is there to compare
        error.facts = AdapterInfo(rank=rank, base_model=base, target_modules=modules)
        raise
    return rank, base, modules


def validate(directory: pathlib.Path, limits: Limits) -> AdapterInfo:
    """The adapter's facts if this server can serve it; else AdapterError with the first failing reason."""
    unsafe = sorted(
        str(p.relative_to(directory)) for p in directory.rglob("*") if p.name.lower().endswith(UNSAFE_SUFFIXES)
    )
    if unsafe:
        raise AdapterError(
            FailureReason.UNSAFE_WEIGHTS_FORMAT,
            f"pickle-format files are refused (use safetensors): {quote(unsafe[:5])}",
        )
    links = [p for p in directory.rglob("*") if p.is_symlink()]
    if links:
        raise AdapterError(FailureReason.UNSAFE_KEY, f"symbolic links are refused: {quote(links[0].name)}")
    config = read_config(directory)
    rank, base, modules = check_config(config, limits)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file() or weights.stat().st_size == 0:
        raise AdapterError(FailureReason.WEIGHTS_MISSING, f"{WEIGHTS_FILE} is missing or empty")
    size = directory_bytes(directory)
    if size > limits.max_bytes:
        raise AdapterError(FailureReason.TOO_LARGE, f"{size} bytes, over the limit of {limits.max_bytes}")
    check_weights(weights, config, limits)
    return AdapterInfo(rank=rank, base_model=base, target_modules=modules, size_bytes=size)


ENTRY_BYTES = 512  # a tensor's header entry: ~4x a compact one of the longest module names (peft writes ~130 bytes)
METADATA_BYTES = 2**20  # and the header's __metadata__
BIG_HEADER = 2**20  # parsed one at a time, with the heap given back after: a JSON header takes ~6x its size to parse
_big_header = threading.Lock()


def check_weights(weights: pathlib.Path, config: dict[str, Any], limits: Limits) -> None:
    """The safetensors header parsed strictly, then every tensor checked against the config, the server's allowed
    modules and (when known) the base model's modules and dims, then every value (finite, bounded); AdapterError
    otherwise. A header longer than the base model's tensors could need is refused before it is parsed."""
    base = basemodel.for_checks(limits.base_config)
    with weights.open("rb") as stream:
        length = safetensors_header.header_length(stream.read(8), weights.stat().st_size, what=weights.name)
    if base is not None and length > 2 * base.module_count() * ENTRY_BYTES + METADATA_BYTES:
        raise AdapterError(
            FailureReason.WEIGHTS_MISMATCH,
            f"the header is {length} bytes; the base model has {base.module_count()} modules, two tensors each at "
            f"most, whose entries need at most {2 * base.module_count() * ENTRY_BYTES + METADATA_BYTES} bytes",
        )
    refusal: AdapterError | None
    header: safetensors_header.Header | None
    with _big_header if length > BIG_HEADER else contextlib.nullcontext():
        try:
            header = safetensors_header.read(weights)
            tensors.check(header, config, allowed=limits.target_modules, base=base)
        except AdapterError as error:
            # The refusal is kept (the adapter's verdict): neither its traceback nor this frame may keep the parsed
            # header alive with it.
            refusal, header = error.with_traceback(None), None
        else:
            refusal = None
        if length > BIG_HEADER:
            release_memory()
    if refusal is not None:
        raise refusal
    assert header is not None  # else refused
    values.check(weights, header, values.bounds(config))


def release_memory() -> None:
    """Give the heap a large parse freed back to the OS: glibc keeps it in the worker thread's arena otherwise."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
