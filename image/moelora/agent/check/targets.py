"""An adapter's target_modules judged against the base model's modules and the server's allowed ones, from the config
alone (before the weights are downloaded).

peft's semantics (`check_target_module_exists`): a list names modules by their full name or a dotted suffix of it; a
string is a regular expression that must match a module's whole name (`re.fullmatch`), except peft's shorthand
"all-linear". vLLM ignores the config's target_modules and loads whatever tensors the file holds, so this check is
ours: every module a list names or a pattern matches must be a LoRA-targetable module of the base model
(UnknownTargetModules otherwise, also for a name or pattern that matches none), and a module the server allows
(UnsupportedTargetModules). The same holds for target_parameters, the LoRA of fused expert weights: the server
must allow its projection, since the operator has vLLM build LoRA for the allowed modules only.

A tenant's pattern is matched in a separate interpreter with a deadline and a memory limit: Python's `re` cannot be
interrupted, and nested repetition can take exponential time, holding the GIL (the whole agent) all along.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
from collections.abc import Iterable
from typing import Any

from moelora.agent.check.basemodel import BaseModel
from moelora.agent.errors import AdapterError, TransientError, quote
from moelora.api import FailureReason

ALL_LINEAR = "all-linear"  # peft: every linear layer but the output layer
OUTPUT_LAYER = "lm_head"
MAX_ENTRIES = 1024  # distinct list entries; peft's own saves name a handful of short names
MATCH_SECONDS = 5.0
MATCH_MEMORY = 512 * 2**20  # address space of the matching interpreter
_SHOWN = 3  # names quoted in a refusal
FUSED = {"gate_up_proj": frozenset({"gate_proj", "up_proj"})}  # a fused parameter's LoRA changes both projections

# Reads {"pattern", "names"} on stdin, writes the indices of the names the pattern fully matches, or the error.
_MATCHER = """
import json, re, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
job = json.load(sys.stdin)
try:
    pattern = re.compile(job["pattern"])
except (re.error, RecursionError, OverflowError) as error:
    json.dump({{"error": str(error)}}, sys.stdout)
else:
    json.dump({{"matched": [i for i, name in enumerate(job["names"]) if pattern.fullmatch(name)]}}, sys.stdout)
"""


def targetable(base: BaseModel) -> list[str]:
    """Every LoRA-targetable module of the base model by its full name, per expert for MoE layers."""
    names = list(base.top)
    for i, layer in enumerate(base.layers):
        prefix = f"model.layers.{i}"
        names += [f"{prefix}.{module}" for module in layer.modules]
        names += [f"{prefix}.mlp.experts.{e}.{p}" for e in range(layer.experts) for p in layer.expert_dims]
    return names


def containers(base: BaseModel) -> list[str]:
    """The other modules of the base model a pattern may match (containers, norms, embeddings): none is a LoRA
    target. Not every module transformers has, only enough that a sweeping pattern is caught."""
    names = ["model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb"]
    norms = ("self_attn.q_norm", "self_attn.k_norm") if base.model_type in ("qwen3", "qwen3_moe") else ()
    for i, layer in enumerate(base.layers):
        prefix = f"model.layers.{i}"
        names += [prefix, f"{prefix}.self_attn", f"{prefix}.mlp", f"{prefix}.input_layernorm"]
        names += [f"{prefix}.post_attention_layernorm", *(f"{prefix}.{n}" for n in norms)]
        if layer.experts:
            names += [f"{prefix}.mlp.experts", *(f"{prefix}.mlp.experts.{e}" for e in range(layer.experts))]
    return names


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _allowed(matched: Iterable[str], allowed: frozenset[str], what: str) -> None:
    refused = sorted({_leaf(name) for name in matched} - allowed) if allowed else []
    if refused:
        raise AdapterError(
            FailureReason.UNSUPPORTED_TARGET_MODULES,
            f"{what} targets {quote(refused)}, this server allows only {sorted(allowed)}",
        )


def check(target_modules: Any, *, base: BaseModel | None, allowed: frozenset[str]) -> None:
    """AdapterError unless `target_modules` (a non-empty list of names, or a string; checked by the caller) names
    only LoRA-targetable modules of `base` that `allowed` (short names; empty: any) allows. Without a base model
    only the server's list is applied, and a pattern must then be one of its names."""
    if isinstance(target_modules, str):
        _check_pattern(target_modules, base=base, allowed=allowed)
    else:
        _check_names(list(target_modules), base=base, allowed=allowed)


def check_parameters(parameters: Any, *, allowed: frozenset[str]) -> None:
    """AdapterError unless the server allows the projection of each of `target_parameters` (LoRA of transformers'
    fused 3-D expert weights, e.g. mlp.experts.gate_up_proj): by its name, or a fused gate_up_proj by both gate_proj
    and up_proj. vLLM builds expert LoRA only where the server's targetModules select the experts, so one it would
    not build is refused here instead of its tensors being dropped. A malformed list is peft_moe.plan's to refuse."""
    if not allowed or not isinstance(parameters, list):
        return
    refused = [name for name in parameters if isinstance(name, str) and not _allows_parameter(name, allowed)]
    if refused:
        raise AdapterError(
            FailureReason.UNSUPPORTED_TARGET_MODULES,
            f"target_parameters {quote(refused[:_SHOWN])}, this server allows only {sorted(allowed)}",
        )


def _allows_parameter(name: str, allowed: frozenset[str]) -> bool:
    short = _leaf(name)
    return short in allowed or (short in FUSED and FUSED[short] <= allowed)


def _check_names(entries: list[str], *, base: BaseModel | None, allowed: frozenset[str]) -> None:
    entries = sorted(set(entries))
    if base is not None:
        _known(entries, base)
    extra = sorted(set(entries) - allowed) if allowed else []
    if extra:
        raise AdapterError(
            FailureReason.UNSUPPORTED_TARGET_MODULES,
            f"targets {quote(extra)}, this server allows only {sorted(allowed)}",
        )


def _known(entries: list[str], base: BaseModel) -> None:
    if len(entries) > MAX_ENTRIES:
        raise AdapterError(
            FailureReason.UNKNOWN_TARGET_MODULES, f"target_modules names {len(entries)} modules, over {MAX_ENTRIES}"
        )
    by_leaf: dict[str, list[str]] = collections.defaultdict(list)
    for name in targetable(base):
        by_leaf[_leaf(name)].append(name)
    for entry in entries:
        if not any(name == entry or name.endswith("." + entry) for name in by_leaf.get(_leaf(entry), ())):
            raise AdapterError(
                FailureReason.UNKNOWN_TARGET_MODULES,
                f"target_modules names {quote(entry)}, which is not a LoRA-targetable module of the base model "
                f"({base.model_type}: e.g. {quote(sorted(by_leaf)[:8])})",
            )


def _check_pattern(pattern: str, *, base: BaseModel | None, allowed: frozenset[str]) -> None:
    if base is None:
        if allowed and pattern not in allowed:
            raise AdapterError(
                FailureReason.UNSUPPORTED_TARGET_MODULES,
                f"target_modules is the pattern {quote(pattern)}; this server allows only {sorted(allowed)}: list "
                "the modules explicitly",
            )
        return
    targets = targetable(base)
    if pattern == ALL_LINEAR:
        _allowed([n for n in targets if n != OUTPUT_LAYER], allowed, f"the pattern {quote(pattern)}")
        return
    others = containers(base)
    matched = matches(pattern, targets + others)
    what = f"the pattern {quote(pattern)}"
    other = set(others)
    wrong = [name for name in matched if name in other]
    if wrong:
        raise AdapterError(
            FailureReason.UNKNOWN_TARGET_MODULES,
            f"{what} matches modules that are not LoRA-targetable: {quote(wrong[:_SHOWN])}"
            + (f" and {len(wrong) - _SHOWN} more" if len(wrong) > _SHOWN else ""),
        )
    if not matched:
        raise AdapterError(
            FailureReason.UNKNOWN_TARGET_MODULES, f"{what} matches no module of the base model ({base.model_type})"
        )
    _allowed(matched, allowed, what)


_verdicts: collections.OrderedDict[tuple[str, int], tuple[int, ...]] = collections.OrderedDict()
_verdicts_lock = threading.Lock()
_VERDICTS_MAX = 256


def matches(pattern: str, names: list[str]) -> list[str]:
    """The names `pattern` fully matches (re.fullmatch, as peft does), evaluated in a child interpreter; AdapterError
    (ConfigInvalid) for a pattern that does not compile or runs over MATCH_SECONDS or MATCH_MEMORY. Remembered per
    (pattern, names), since the periodic re-check asks again."""
    key = (pattern, hash(tuple(names)))
    with _verdicts_lock:
        if key in _verdicts:
            _verdicts.move_to_end(key)
            return [names[i] for i in _verdicts[key]]
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _MATCHER.format(memory=MATCH_MEMORY)],
            input=json.dumps({"pattern": pattern, "names": names}).encode(),
            capture_output=True,
            timeout=MATCH_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise AdapterError(
            FailureReason.CONFIG_INVALID,
            f"target_modules {quote(pattern)} took over {MATCH_SECONDS:g} s to match the base model's module names",
        ) from None
    except OSError as error:
        raise TransientError(f"cannot start the interpreter that matches target_modules: {error}") from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        if b"MemoryError" in done.stderr:
            raise AdapterError(
                FailureReason.CONFIG_INVALID,
                f"target_modules {quote(pattern)} needs over {MATCH_MEMORY >> 20} MiB to match module names",
            ) from None
        raise TransientError(f"matching target_modules failed (exit {done.returncode})") from None
    if "error" in answer:
        raise AdapterError(
            FailureReason.CONFIG_INVALID,
            f"target_modules {quote(pattern)} is not a regular expression: {quote(answer['error'])}",
        )
    indices = tuple(answer["matched"])
    with _verdicts_lock:
        _verdicts[key] = indices
        while len(_verdicts) > _VERDICTS_MAX:
            _verdicts.popitem(last=False)
    return [names[i] for i in indices]
