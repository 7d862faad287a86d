"""An adapter's tensors checked against its own config, this server's allowed modules and the base model.

peft saves a LoRA of module M as `base_model.model.M.lora_A.weight` (r, in) and `...lora_B.weight` (out, r). A
`target_parameters` LoRA of fused 3-D expert weights (peft's ParamWrapper) is saved under the experts module, one
`base_layer.` deeper for each further parameter wrapped around it, as lora_A (E*r, in) and lora_B (out, r*E); its
parameter is told apart by its shape. Structure (names, pairs, rank) is always checked; module existence and dims
only when the base model is known. Refusals: WeightsInvalid (not a LoRA), WeightsMismatch (does not fit the config
or the base model), UnsupportedTargetModules (a module this server does not allow).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from moelora.agent.check.basemodel import BaseModel
from moelora.agent.check.safetensors_header import Header, TensorInfo
from moelora.agent.errors import AdapterError, quote
from moelora.api import FailureReason

_NAME = re.compile(r"base_model\.model\.((?:[A-Za-z0-9_]+\.)*[A-Za-z0-9_]+)\.(lora_A|lora_B)\.weight")
_FUSED = re.compile(r"(.*\.experts)((?:\.base_layer)*)")
_REGEX_CHARS = frozenset("^$*+?()[]{}|\\")
# The per-expert modules a fused parameter becomes, for the server's allowed modules.
_FUSED_AS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


@dataclasses.dataclass(frozen=True)
class Pair:
    module: str
    a: TensorInfo
    b: TensorInfo


def _invalid(problem: str) -> AdapterError:
    return AdapterError(FailureReason.WEIGHTS_INVALID, problem)


def _mismatch(problem: str) -> AdapterError:
    return AdapterError(FailureReason.WEIGHTS_MISMATCH, problem)


def pairs(header: Header) -> list[Pair]:
    """The tensors as (lora_A, lora_B) pairs per module; WeightsInvalid for anything else."""
    if not header.tensors:
        raise _invalid("the weights hold no tensors")
    found: dict[str, dict[str, TensorInfo]] = {}
    for name, info in header.tensors.items():
        match = _NAME.fullmatch(name)
        if not match:
            raise _invalid(f"tensor {quote(name)} is not a LoRA weight (base_model.model.<module>.lora_A|B.weight)")
        if len(info.shape) != 2 or 0 in info.shape:
            raise _invalid(f"tensor {quote(name)} has shape {list(info.shape)}, not a 2-D matrix without empty dims")
        found.setdefault(match.group(1), {})[match.group(2)] = info
    result = []
    for module, kinds in found.items():
        missing = {"lora_A", "lora_B"} - set(kinds)
        if missing:
            raise _invalid(
                f"module {quote(module)} has {'lora_B' if 'lora_A' in missing else 'lora_A'} without {missing.pop()}"
            )
        result.append(Pair(module=module, a=kinds["lora_A"], b=kinds["lora_B"]))
    return result


def _ranks(module: str, config: dict[str, Any]) -> set[int]:
    """The ranks `module` may have: its rank_pattern entry (matched as peft does, by name suffix), else `r`.

    Patterns are compared as literal suffixes, never compiled (a tenant's regex could take forever); when the
    config has regex patterns no suffix matched, any of its ranks is accepted.
    """
    rank = config["r"]
    pattern = config.get("rank_pattern") or {}
    for key, value in pattern.items():
        if module == key or module.endswith("." + key):
            return {value}
    if any(_REGEX_CHARS & set(key) for key in pattern):
        return {rank, *pattern.values()}
    return {rank}


def _targeted(module: str, targets: Any) -> bool:
    if not isinstance(targets, list):
        return True  # a regex or "all-linear": check_config has judged it against the server's list
    return any(module == t or module.endswith("." + t) for t in targets if isinstance(t, str))


def _fused_parameter(pair: Pair, module: str, config: dict[str, Any], base: BaseModel | None) -> str | None:
    """Which targeted fused parameter of `module` the pair's shapes fit (None if none); checks the expert count."""
    targets = config.get("target_parameters")
    names = [
        t.rsplit(".", 1)[1]
        for t in (targets if isinstance(targets, list) else [])
        if isinstance(t, str) and "." in t and _targeted(module, [t.rsplit(".", 1)[0]])
    ]
    if not names:
        raise _mismatch(f"{quote(module)} holds fused expert weights, but target_parameters names none of its")
    (a_rows, a_in), (b_out, b_cols) = pair.a.shape, pair.b.shape
    # peft matches rank_pattern against the parameter's full name (…mlp.experts.gate_up_proj), not the module's.
    rank_of = {n: _ranks(f"{module}.{n}", config) for n in names}
    ranks = set().union(*rank_of.values())
    if a_rows != b_cols or not any(a_rows % r == 0 for r in ranks):
        raise _mismatch(
            f"{quote(module)}: lora_A {list(pair.a.shape)} and lora_B {list(pair.b.shape)} are not "
            f"(experts*r, in) and (out, r*experts) for rank {sorted(ranks)}"
        )
    if base is None:
        return names[0]
    experts, params = base.fused(module)
    if not experts:
        raise _mismatch(f"the base model has no fused experts module {quote(module)}")
    if not any(a_rows == r * experts for r in ranks):
        raise _mismatch(f"{quote(module)}: lora_A has {a_rows} rows, not rank {sorted(ranks)} x {experts} experts")
    fits = [n for n in names if params.get(n) == (a_in, b_out) and a_rows in {r * experts for r in rank_of[n]}]
    if not fits:
        wanted = {n: params.get(n) for n in names}
        raise _mismatch(f"{quote(module)}: (in, out) = ({a_in}, {b_out}) fits none of the targeted {quote(wanted)}")
    return fits[0]


def _allowed(leaves: tuple[str, ...], allowed: frozenset[str]) -> None:
    refused = sorted(set(leaves) - allowed) if allowed else []
    if refused:
        raise AdapterError(
            FailureReason.UNSUPPORTED_TARGET_MODULES,
            f"the weights adapt {quote(refused)}, this server allows only {sorted(allowed)}",
        )


def check(header: Header, config: dict[str, Any], *, allowed: frozenset[str], base: BaseModel | None) -> None:
    """Every tensor a LoRA weight of a module the config targets, the server allows and the base model has (with
    its dims, when `base` is known), at the config's rank; AdapterError otherwise. `config` passed check_config."""
    if base is not None and len(header.tensors) > 2 * base.module_count():
        raise _mismatch(
            f"{len(header.tensors)} tensors; the base model has {base.module_count()} modules, two tensors each at most"
        )
    fused_taken: dict[str, set[str]] = {}
    for pair in pairs(header):
        fused = _FUSED.fullmatch(pair.module)
        if fused and config.get("target_parameters"):
            experts_module = fused.group(1)
            parameter = _fused_parameter(pair, experts_module, config, base)
            taken = fused_taken.setdefault(experts_module, set())
            if parameter in taken and base is not None:
                raise _mismatch(f"{quote(experts_module)}: two LoRA pairs for the fused parameter {parameter}")
            taken.add(parameter or "")
            _allowed(_FUSED_AS.get(parameter or "", (parameter or "",)), allowed)
            continue
        _check_pair(pair, config, allowed=allowed, base=base)


def _check_pair(pair: Pair, config: dict[str, Any], *, allowed: frozenset[str], base: BaseModel | None) -> None:
    module, leaf = pair.module, pair.module.rsplit(".", 1)[-1]
    if not _targeted(module, config.get("target_modules")):
        raise _mismatch(f"tensors for {quote(module)}, which target_modules does not name")
    _allowed((leaf,), allowed)
    (a_rank, a_in), (b_out, b_rank) = pair.a.shape, pair.b.shape
    ranks = _ranks(module, config)
    if a_rank != b_rank or a_rank not in ranks:
        raise _mismatch(
            f"{quote(module)}: lora_A {list(pair.a.shape)} and lora_B {list(pair.b.shape)} do not have "
            f"the config's rank {quote(sorted(ranks))}"
        )
    if base is None:
        return
    dims = base.dims(module)
    if dims is None:
        raise _mismatch(f"the base model has no module {quote(module)}")
    if (a_in, b_out) != dims:
        raise _mismatch(
            f"{quote(module)} is (in, out) = {dims} in the base model; lora_A {list(pair.a.shape)} and "
            f"lora_B {list(pair.b.shape)} make it ({a_in}, {b_out})"
        )
