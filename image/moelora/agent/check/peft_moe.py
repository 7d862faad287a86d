"""PEFT's fused MoE expert LoRA (`target_parameters` on 3D expert weights) rewritten per expert, the layout vLLM loads.

peft adapts fused experts (transformers 5: `mlp.experts.gate_up_proj` (E, 2I, H), `mlp.experts.down_proj` (E, H, I))
with one ParamWrapper per parameter, nested on the experts module, and saves each as
`<module>.experts[.base_layer]*.lora_{A,B}.weight`: the innermost wrapper is the parameter the module registers first
(gate_up_proj), the outermost the last (down_proj). A is (E*r, in), expert-major; B is (out, r*E), expert-minor; so
expert e's delta is `B.view(out, r, E)[:, :, e] @ A.view(E, r, in)[e] * scaling`, and gate_up's output rows are the
gate rows then the up rows.

vLLM keeps those tensors as they are only for models whose experts it also holds fused (GPT-OSS). For the others
(Qwen3-MoE, ...) it reads per-expert 2D LoRAs `<module>.experts.<e>.{gate,up,down}_proj` and refuses the fused ones
unless the engine runs with --enable-mixed-moe-lora-format and the load request sets is_3d_lora_weight (vLLM 0.32).
Rewriting them here serves the same adapter on any vLLM that loads per-expert adapters, whatever its flags.

Per-module scaling from peft's rank_pattern/alpha_pattern (and rsLoRA's alpha/sqrt(r)) is folded into lora_B where
the rewritten names would resolve to a different scaling, so the delta of every expert stays exactly peft's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from moelora.agent.check import safetensors_header, safetensors_stream, values
from moelora.agent.check.layout import CONFIG_FILE, WEIGHTS_FILE
from moelora.agent.check.safetensors_header import TensorInfo
from moelora.agent.check.safetensors_stream import TensorSpec
from moelora.agent.errors import AdapterError
from moelora.api import FailureReason

logger = logging.getLogger(__name__)

CONVERTED_DIR = "vllm-per-expert"  # inside the adapter's cache directory, next to the original files
_TEMP_PREFIX = ".per-expert-tmp-"
GATE_UP, DOWN = "gate_up_proj", "down_proj"
# What each fused parameter becomes per expert: gate_up_proj's rows split in half (gate first), down_proj as is.
PROJECTIONS = {GATE_UP: ("gate_proj", "up_proj"), DOWN: ("down_proj",)}
# Base models whose vLLM implementation keeps the experts fused and reads peft's tensors unchanged.
NATIVE_FUSED_MODELS = ("gpt-oss",)
_PEFT_PREFIX = "base_model.model."
_EXPERT_KEY = re.compile(r"^(?P<module>.+\.experts)(?P<nest>(?:\.base_layer)*)\.lora_(?P<ab>[AB])\.weight$")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A fused-expert adapter to rewrite: its target_parameters, each ending in gate_up_proj or down_proj."""

    parameters: tuple[str, ...]


def _invalid(message: str) -> AdapterError:
    return AdapterError(FailureReason.CONFIG_INVALID, message)


def plan(config: dict[str, Any], *, base_model: str) -> Plan | None:
    """Whether this adapter_config.json needs the rewrite (a Plan) or not (None); AdapterError if vLLM could not
    serve its target_parameters either way. Reads the config only, so it runs before the weights are downloaded."""
    parameters = config.get("target_parameters")
    if not parameters:
        return None
    if not isinstance(parameters, list) or not all(isinstance(p, str) and p for p in parameters):
        raise _invalid(f"'target_parameters' must be a list of parameter names, got {parameters!r}")
    if any(name in base_model.lower() for name in NATIVE_FUSED_MODELS):
        return None
    unsupported = [p for p in parameters if not _is_expert_parameter(p)]
    if unsupported:
        raise _invalid(
            f"target_parameters {unsupported} are not fused MoE experts' gate_up_proj/down_proj, "
            "the only parameter LoRAs vLLM serves"
        )
    return Plan(parameters=tuple(parameters))


def _is_expert_parameter(name: str) -> bool:
    module, _, short = name.rpartition(".")
    return short in PROJECTIONS and (not module or module.split(".")[-1] == "experts")


def servable(directory: pathlib.Path, *, base_model: str) -> pathlib.Path:
    """The directory vLLM should load for the adapter in `directory`: itself, or its per-expert rewrite in
    `directory/CONVERTED_DIR` (written once into a temporary directory, then renamed: complete or absent)."""
    config = json.loads((directory / CONFIG_FILE).read_text())
    the_plan = plan(config, base_model=base_model)
    if the_plan is None:
        return directory
    out = directory / CONVERTED_DIR
    if out.is_dir():  # the cache entry is content-addressed: an earlier rewrite of it is still right
        return out
    temp = pathlib.Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=directory))
    try:
        try:
            converted = rewrite(directory / WEIGHTS_FILE, temp / WEIGHTS_FILE, config, the_plan)
        except (AdapterError, OSError):
            raise
        except Exception as error:  # noqa: BLE001 - a file that cannot be rewritten is the adapter's fault
            raise _invalid(f"cannot rewrite {WEIGHTS_FILE} per expert: {error}") from None
        (temp / CONFIG_FILE).write_text(json.dumps(converted, indent=2))
        try:
            os.rename(temp, out)
        except OSError:
            if not out.is_dir():  # else another worker finished the same rewrite first
                raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    logger.info("rewrote the fused MoE expert LoRA in %s per expert for vLLM (%s)", directory.name, the_plan.parameters)
    return out


def cache_version(path: str) -> str:
    """The cache entry (version) a path vLLM loads belongs to: the rewrite lives inside its adapter's entry."""
    pure = pathlib.PurePath(path)
    return pure.parent.name if pure.name == CONVERTED_DIR else pure.name


# ---- ranks and scaling, resolved as peft resolves them ----------------------------------------------------------


def _pattern_value(patterns: dict[str, Any], name: str) -> Any:
    """peft's rule: a key matches when it matches the name's tail at a '.' boundary; the first match wins."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return None


def rank_and_scaling(config: dict[str, Any], name: str) -> tuple[int, float]:
    """(rank, scaling) peft uses for module or parameter `name` (no `base_model.model.` prefix)."""
    rank = _pattern_value(config.get("rank_pattern") or {}, name) or config["r"]
    alpha = _pattern_value(config.get("alpha_pattern") or {}, name)
    alpha = config.get("lora_alpha", 8) if alpha is None else alpha
    if config.get("use_rslora"):
        return rank, alpha / math.sqrt(rank)
    return rank, alpha / rank


# ---- the rewrite ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Step:
    """One source tensor, read once, and the tensors made from it."""

    source: str
    outputs: list[tuple[TensorSpec, Callable[[Any], Any]]]


def _matches(parameter: str, key: str) -> bool:
    return key == parameter or key.endswith(f".{parameter}")


def _assign(module: str, wrappers: list[dict[str, tuple[int, ...]]], parameters: tuple[str, ...]) -> list[str]:
    """The parameter each wrapper (innermost first) adapts, checked against the tensors' shapes."""
    names = sorted({p.rpartition(".")[2] for p in parameters if any(_matches(p, f"{module}.{s}") for s in PROJECTIONS)})
    if len(wrappers) == 1 and len(names) == 1:
        return names
    if len(wrappers) == 2 and names == [DOWN, GATE_UP]:
        for order in ([GATE_UP, DOWN], [DOWN, GATE_UP]):
            gate_up, down = (wrappers[order.index(GATE_UP)], wrappers[order.index(DOWN)])
            # gate_up maps hidden -> 2*intermediate and down maps intermediate -> hidden
            if gate_up["B"][0] == 2 * down["A"][1] and gate_up["A"][1] == down["B"][0]:
                return order
    raise _invalid(f"the LoRA tensors of {module} do not match target_parameters {list(parameters)}")


def _steps(
    prefix: str,
    module: str,
    wrapper: dict[str, tuple[int, ...]],
    parameter: str,
    config: dict[str, Any],
    converted: dict[str, Any],
    dtypes: dict[str, str],
    keys: dict[str, str],
) -> list[_Step]:
    """The steps that split one fused wrapper's A and B per expert."""
    rank, scaling = rank_and_scaling(config, f"{module}.{parameter}")
    (rows, in_features), (out_features, cols) = wrapper["A"], wrapper["B"]
    if rows % rank or cols != rows or rows == 0:
        raise _invalid(f"{module}.{parameter}: lora_A {wrapper['A']} and lora_B {wrapper['B']} are not rank {rank}")
    experts = rows // rank
    projections = PROJECTIONS[parameter]
    if out_features % len(projections):
        raise _invalid(f"{module}.{parameter}: lora_B's {out_features} rows do not split into gate and up")
    part = out_features // len(projections)
    b_bound = values.bounds(converted).b
    a_steps: list[tuple[TensorSpec, Callable[[Any], Any]]] = []
    b_steps: list[tuple[TensorSpec, Callable[[Any], Any]]] = []
    for e in range(experts):
        for i, projection in enumerate(projections):
            name = f"{prefix}{module}.{e}.{projection}"
            # the rewritten name resolves to its own scaling; what differs from peft's is folded into lora_B
            factor = scaling / rank_and_scaling(converted, f"{module}.{e}.{projection}")[1]
            a_spec = TensorSpec(f"{name}.lora_A.weight", dtypes[keys["A"]], (rank, in_features))
            b_spec = TensorSpec(f"{name}.lora_B.weight", dtypes[keys["B"]], (part, rank))
            a_steps.append((a_spec, functools.partial(_expert_a, shape=(experts, rank, in_features), expert=e)))
            b_rows = slice(i * part, (i + 1) * part)
            b_view = functools.partial(
                _expert_b,
                shape=(out_features, rank, experts),
                rows=b_rows,
                expert=e,
                factor=factor,
                spec=b_spec,
                bound=b_bound,
            )
            b_steps.append((b_spec, b_view))
    return [_Step(keys["A"], a_steps), _Step(keys["B"], b_steps)]


def _expert_a(t: np.ndarray, *, shape: tuple[int, int, int], expert: int) -> np.ndarray:
    """One expert's lora_A out of the fused (experts * rank, in) tensor."""
    return t.reshape(shape)[expert]


def _expert_b(
    t: np.ndarray,
    *,
    shape: tuple[int, int, int],
    rows: slice,
    expert: int,
    factor: float,
    spec: TensorSpec,
    bound: float,
) -> np.ndarray:
    """One expert's projection of the fused (out, rank * experts) lora_B, scaled by `factor`."""
    return _scaled(t.reshape(shape)[rows, :, expert], factor, spec, bound)


def _scaled(words: np.ndarray, factor: float, spec: TensorSpec, bound: float) -> np.ndarray:
    """lora_B's raw words times `factor` as torch computes `(t.float() * factor).to(dtype)`: in float32, rounded to
    nearest even; the result must pass the value checks under the new config's `bound` too (a small scaling of the
    new names makes the stored values larger)."""
    if factor == 1.0:
        return words
    product = _as_float32(words, spec.dtype) * np.float32(factor)
    if spec.dtype == "F32":
        scaled = product.view(np.uint32)
    elif spec.dtype == "F16":
        scaled = product.astype(np.float16).view(np.uint16)
    else:
        bits = product.view(np.uint32)
        scaled = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(
            np.uint16
        )
    values.check_array(scaled, name=spec.name, dtype=spec.dtype, bound=bound)
    return scaled


def _as_float32(words: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return words.view(np.float32)
    if dtype == "F16":
        return words.view(np.float16).astype(np.float32)
    return (words.astype(np.uint32) << np.uint32(16)).view(np.float32)


def converted_config(config: dict[str, Any], projections: Sequence[str]) -> dict[str, Any]:
    """The adapter_config.json of the rewrite: no target_parameters, the per-expert projections as target_modules.

    Where the config has rank/alpha patterns, a first entry pins the per-expert modules to the global r and
    lora_alpha (a key like "down_proj" would otherwise match them too), so they scale alike on a vLLM that reads
    the patterns and on one that ignores them; their own scaling is then folded into lora_B.
    """
    modules = config.get("target_modules") or []
    experts = rf".*\.experts\.\d+\.(?:{'|'.join(projections)})"
    if isinstance(modules, str):
        targets: Any = rf"(?:{modules})|{experts}"
    else:
        targets = list(modules) + [p for p in projections if p not in modules]
    converted = dict(config, target_parameters=None, target_modules=targets)
    for field, value in (("rank_pattern", config.get("r")), ("alpha_pattern", config.get("lora_alpha", 8))):
        if config.get(field):
            converted[field] = {experts: value, **config[field]}
    return converted


def rewrite(source: pathlib.Path, target: pathlib.Path, config: dict[str, Any], the_plan: Plan) -> dict[str, Any]:
    """Write `source`'s tensors to `target` with every fused expert LoRA split per expert; return the new config.

    Streams: each source tensor is read once and its pieces written before the next is read, so memory holds one
    source tensor (one layer's fused A or B) at a time. Tensors are handled as their raw words (values.WORD), so the
    split is exact for every dtype. `source` has passed validate(); the header is read by our own parser again.
    """
    header = safetensors_header.read(source)
    infos = header.tensors
    names = sorted(infos, key=lambda k: infos[k].begin)
    shapes = {k: infos[k].shape for k in names}
    dtypes = {k: infos[k].dtype for k in names}
    fused: dict[tuple[str, str], dict[int, dict[str, str]]] = {}
    plain = []
    for key in names:
        found = _EXPERT_KEY.match(key)
        if found is None:
            plain.append(key)
            continue
        full = found["module"]
        prefix = _PEFT_PREFIX if full.startswith(_PEFT_PREFIX) else ""
        depth = found["nest"].count(".base_layer")
        fused.setdefault((prefix, full.removeprefix(prefix)), {}).setdefault(depth, {})[found["ab"]] = key
    if not fused:
        raise _invalid(f"target_parameters {list(the_plan.parameters)} but {WEIGHTS_FILE} has no fused expert LoRA")
    plans = []
    projections: set[str] = set()
    for (prefix, module), by_depth in sorted(fused.items()):
        keys = [by_depth[d] for d in sorted(by_depth, reverse=True)]  # innermost first
        if any(set(k) != {"A", "B"} for k in keys) or sorted(by_depth) != list(range(len(keys))):
            raise _invalid(f"{module}: incomplete fused expert LoRA tensors in {WEIGHTS_FILE}")
        wrappers = [{ab: shapes[k[ab]] for ab in "AB"} for k in keys]
        if any(len(s) != 2 for w in wrappers for s in w.values()):
            raise _invalid(f"{module}: fused expert LoRA tensors must be 2D")
        for parameter, wrapper, wkeys in zip(_assign(module, wrappers, the_plan.parameters), wrappers, keys):
            plans.append((prefix, module, wrapper, parameter, wkeys))
            projections.update(PROJECTIONS[parameter])
    order = [p for p in ("gate_proj", "up_proj", "down_proj") if p in projections]
    converted = converted_config(config, order)
    steps = [_Step(k, [(TensorSpec(k, dtypes[k], shapes[k]), lambda t: t)]) for k in plain]
    for prefix, module, wrapper, parameter, wkeys in plans:
        steps += _steps(prefix, module, wrapper, parameter, config, converted, dtypes, wkeys)
    specs = [spec for step in steps for spec, _ in step.outputs]
    data_start = source.stat().st_size - header.data_bytes
    with source.open("rb") as stream:
        produced = _produce(stream, data_start, infos, steps)
        safetensors_stream.write(target, specs, produced, metadata=header.metadata or None)
    return converted


def _read(stream: Any, data_start: int, info: TensorInfo) -> np.ndarray:
    """One tensor's raw words, in its shape."""
    stream.seek(data_start + info.begin)
    raw = stream.read(info.end - info.begin)
    if len(raw) != info.end - info.begin:
        raise _invalid(f"{WEIGHTS_FILE} ended inside tensor {info.name}")
    return np.frombuffer(raw, values.WORD[info.dtype]).reshape(info.shape)


def _produce(
    stream: Any, data_start: int, infos: dict[str, TensorInfo], steps: list[_Step]
) -> Iterator[tuple[str, Any]]:
    for step in steps:
        words = _read(stream, data_start, infos[step.source])
        for spec, make in step.outputs:
            yield spec.name, np.ascontiguousarray(make(words))
        del words
