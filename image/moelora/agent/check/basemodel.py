"""The base model's LoRA-targetable modules and their (in, out) dims, derived from its config.json.

Names and shapes follow transformers' modeling code for the architectures we serve: Llama-style dense models,
Qwen3-MoE and GPT-OSS. A module is named as in the checkpoint (`model.layers.<i>.self_attn.q_proj`); MoE experts
exist both per expert (`model.layers.<i>.mlp.experts.<e>.gate_proj`, the layout vLLM reads) and as the fused 3-D
parameters of `model.layers.<i>.mlp.experts` that peft's `target_parameters` wraps.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import re
from typing import Any

from moelora.agent.check.strictjson import load_json
from moelora.agent.errors import TransientError, quote
from moelora.api import FailureReason

logger = logging.getLogger(__name__)

Dims = tuple[int, int]  # (in_features, out_features)

DENSE_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
SERVED_TYPES = DENSE_TYPES | {"qwen3_moe", "gpt_oss"}
EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")
_LAYER = re.compile(r"model\.layers\.(0|[1-9][0-9]{0,5})\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.(0|[1-9][0-9]{0,5})\.(gate_proj|up_proj|down_proj)")


class BaseConfigError(ValueError):
    """config.json does not describe a model whose modules we can derive; the message says why."""


@dataclasses.dataclass(frozen=True)
class Layer:
    modules: dict[str, Dims]  # below the layer: "self_attn.q_proj", "mlp.gate", ...
    experts: int  # 0: a dense layer
    expert_dims: dict[str, Dims]  # per expert: "gate_proj", "up_proj", "down_proj"
    fused: dict[str, Dims]  # the fused 3-D parameters of "mlp.experts": "gate_up_proj", "down_proj"


@dataclasses.dataclass(frozen=True)
class BaseModel:
    model_type: str
    layers: tuple[Layer, ...]
    top: dict[str, Dims]  # outside the layers: "lm_head"

    def dims(self, module: str) -> Dims | None:
        """(in, out) of a 2-D module of this model, or None if it has no such module."""
        if module in self.top:
            return self.top[module]
        match = _LAYER.fullmatch(module)
        if not match or int(match.group(1)) >= len(self.layers):
            return None
        layer = self.layers[int(match.group(1))]
        expert = _EXPERT.fullmatch(match.group(2))
        if expert:
            return layer.expert_dims.get(expert.group(2)) if int(expert.group(1)) < layer.experts else None
        return layer.modules.get(match.group(2))

    def fused(self, module: str) -> tuple[int, dict[str, Dims]]:
        """(number of experts, {parameter: (in, out)}) of a fused experts module; (0, {}) if there is none."""
        match = _LAYER.fullmatch(module)
        if not match or match.group(2) != "mlp.experts" or int(match.group(1)) >= len(self.layers):
            return 0, {}
        layer = self.layers[int(match.group(1))]
        return layer.experts, layer.fused

    def module_count(self) -> int:
        """How many LoRA-targetable modules and fused parameters there are: an adapter has at most two tensors each."""
        per_layer = (len(x.modules) + x.experts * len(x.expert_dims) + len(x.fused) for x in self.layers)
        return len(self.top) + sum(per_layer)


def _positive(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**24:
        raise BaseConfigError(f"config.json: {key} must be a positive integer, got {value!r:.40}")
    return value


def _attention(config: dict[str, Any], hidden: int) -> dict[str, Dims]:
    heads = _positive(config, "num_attention_heads")
    kv_heads = _positive(config, "num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    head_dim = _positive({"head_dim": head_dim}, "head_dim")
    return {
        "self_attn.q_proj": (hidden, heads * head_dim),
        "self_attn.k_proj": (hidden, kv_heads * head_dim),
        "self_attn.v_proj": (hidden, kv_heads * head_dim),
        "self_attn.o_proj": (heads * head_dim, hidden),
    }


def _dense_mlp(hidden: int, inter: int) -> dict[str, Dims]:
    return {"mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter), "mlp.down_proj": (inter, hidden)}


def _moe(attention: dict[str, Dims], *, hidden: int, inter: int, experts: int, router: str) -> Layer:
    # peft's ParamWrapper sees Qwen3-MoE's (E, 2I, H) and GPT-OSS's transposed (E, H, 2I) both as in=H, out=2I.
    return Layer(
        modules={**attention, router: (hidden, experts)},
        experts=experts,
        expert_dims={"gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)},
        fused={"gate_up_proj": (hidden, 2 * inter), "down_proj": (inter, hidden)},
    )


def from_config(config: Any) -> BaseModel:
    """The modules of the model config.json describes; BaseConfigError if it is not one we serve."""
    if not isinstance(config, dict):
        raise BaseConfigError("config.json is not a JSON object")
    model_type = config.get("model_type")
    if model_type not in SERVED_TYPES:
        raise BaseConfigError(f"config.json: model_type {model_type!r:.40} is not one whose modules we know")
    hidden = _positive(config, "hidden_size")
    count = _positive(config, "num_hidden_layers")
    attention = _attention(config, hidden)
    top = {"lm_head": (hidden, _positive(config, "vocab_size"))}
    if model_type in DENSE_TYPES:
        layer = Layer(
            modules={**attention, **_dense_mlp(hidden, _positive(config, "intermediate_size"))},
            experts=0,
            expert_dims={},
            fused={},
        )
        return BaseModel(model_type=model_type, layers=(layer,) * count, top=top)
    if model_type == "gpt_oss":
        moe = _moe(
            attention,
            hidden=hidden,
            inter=_positive(config, "intermediate_size"),
            experts=_positive(config, "num_local_experts"),
            router="mlp.router",
        )
        return BaseModel(model_type=model_type, layers=(moe,) * count, top=top)
    # transformers 5 writes Qwen3-MoE's expert count as num_local_experts, earlier versions as num_experts.
    experts = _positive(config, "num_experts" if "num_experts" in config else "num_local_experts")
    moe = _moe(
        attention, hidden=hidden, inter=_positive(config, "moe_intermediate_size"), experts=experts, router="mlp.gate"
    )
    dense = Layer(
        modules={**attention, **_dense_mlp(hidden, _positive(config, "intermediate_size"))},
        experts=0,
        expert_dims={},
        fused={},
    )
    step = _positive(config, "decoder_sparse_step", 1)
    mlp_only = config.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list):
        raise BaseConfigError("config.json: mlp_only_layers must be a list")
    layers = tuple(dense if i in mlp_only or (i + 1) % step else moe for i in range(count))
    return BaseModel(model_type=model_type, layers=layers, top=top)


@functools.lru_cache(maxsize=4)
def _load(path: pathlib.Path, _stamp: tuple[int, int]) -> BaseModel:
    if _stamp[1] > 16 * 2**20:
        raise BaseConfigError(f"{path} is {_stamp[1]} bytes, not a model config")
    try:
        config = load_json(path.read_bytes(), what=str(path), max_depth=16, reason=FailureReason.CONFIG_INVALID)
    except Exception as error:  # noqa: BLE001 - a bad base config is the server's problem, said as such
        raise BaseConfigError(str(error)) from None
    return from_config(config)


def load(path: pathlib.Path) -> BaseModel:
    """The base model described by config.json at `path` (read again only when the file changes); OSError if it
    cannot be read, BaseConfigError if it does not describe a model we serve."""
    stat = path.stat()
    return _load(path, (stat.st_mtime_ns, stat.st_size))


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        logger.warning("%s", message)


def for_checks(path: pathlib.Path | None) -> BaseModel | None:
    """The base model the adapters' dims are checked against; None (said once in the log) when there is no
    config to read or it describes an architecture we do not know, and only dims and module existence go unchecked.
    A configured file that cannot be read is a TransientError: it may still be on its way (the model init container).
    The path may hold one `*` (a hub snapshot's revision, unknown until vLLM has downloaded the model)."""
    if path is not None and "*" in str(path):
        found = sorted(pathlib.Path(path.anchor).glob(str(path.relative_to(path.anchor))))
        if not found:
            raise TransientError(f"the base model's config {quote(str(path))} is not there yet")
        path = found[-1]
    if path is None:
        _say_once(
            "MOELORA_BASE_MODEL_CONFIG is not set: adapters' tensors are not checked against the base model's "
            "modules and dims"
        )
        return None
    try:
        return load(path)
    except OSError as error:
        raise TransientError(f"cannot read the base model's config {quote(str(path))}: {error.strerror}") from None
    except BaseConfigError as error:
        _say_once(f"adapters' tensors are not checked against the base model's modules and dims: {error}")
        return None
