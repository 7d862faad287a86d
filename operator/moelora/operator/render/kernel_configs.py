"""The kernel-config volume: tuned fused MoE-LoRA and base fused-MoE configs mounted at VLLM_TUNED_CONFIG_FOLDER.

`configMap` mode mounts the user's ConfigMap. `auto` mode renders a ConfigMap the operator owns from the set
bundled in `moelora.kernels` (`configs/<GPU>/*.json` and `configs/<GPU>.json`, <GPU> in vLLM's device-name form,
e.g. NVIDIA_H200), picked by the GPU product in the node selector, and cut down to the entries tuned for the
model's MoE shape (moelora.operator.render.model_shapes). vLLM's base fused-MoE files (`E=..,N=..,device_name=...json`:
the experts' own GEMMs, with or without LoRA) go in whole for the shape's experts and intermediate size. vLLM's
files for its dense LoRA ops (`<GPU>_SHRINK.json`, `<GPU>_EXPAND_{TRUE,FALSE}.json`: attention and router
projections) go in whole, with the shape's, when they were tuned for the model's hidden size: their other keys are
sizes the MoE shape does not carry, and vLLM takes the nearest key at each level. Nothing is ever guessed: no set
for the GPU, no entries for the shape, or more than a ConfigMap holds is a SpecProblem, not a silent fallback to
vLLM's defaults. moelora's own table is read through its schema (moelora.api.kernel_table), in the bundle and in a
user's ConfigMap alike: a malformed one is a SpecProblem naming the field, not a kernel failing at start-up. A hash
of the content goes on the pod template, so new configs (or another model's) roll the pods.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import pathlib
import re
from collections.abc import Mapping
from importlib.resources.abc import Traversable
from typing import Any

from moelora.api import KernelConfigMode, ModelServerSpec, MoeShape
from moelora.api.kernel_table import KernelTable, KernelTableError
from moelora.operator.errors import SpecProblem
from moelora.operator.render import model_shapes

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA's GPU feature discovery, e.g. NVIDIA-H200
MAX_CONFIG_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB
BUNDLE_PACKAGE = "moelora.kernels"
_KEY_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelConfigVolume:
    config_map_name: str  # what the volume mounts
    items: list[dict[str, str]] | None  # key -> file name, when ConfigMap keys cannot be the file names
    content_hash: str  # goes on the pod template: new content rolls the pods
    owned_config_map: dict[str, Any] | None = None  # `auto` mode: the ConfigMap the operator creates


def device_name(node_selector: Mapping[str, str]) -> str | None:
    """vLLM's device-name form of the node selector's GPU product: NVIDIA-H200 -> NVIDIA_H200 (as vLLM does)."""
    product = node_selector.get(GPU_PRODUCT_LABEL)
    return product.replace(" ", "_").replace("-", "_") if product else None


def bundle_root() -> Traversable | None:
    """The bundled `configs/` folder of moelora.kernels, found without importing the package (it imports torch)."""
    spec = importlib.util.find_spec(BUNDLE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / "configs"


def read_bundle(gpu: str, *, root: Traversable) -> dict[str, str]:
    """{file name: JSON text} of the configs for one GPU; empty when there are none.

    Two layouts, both mounted flat: `configs/<GPU>/*.json` (vLLM's per-op files, e.g.
    NVIDIA_H200_FUSED_MOE_LORA_W2_SHRINK.json) and `configs/<GPU>.json` (moelora's own kernel's table).
    """
    files: dict[str, str] = {}
    single = root.joinpath(f"{gpu}.json")
    if single.is_file():
        files[single.name] = single.read_text()
    folder = root.joinpath(gpu)
    if folder.is_dir():
        files.update(
            {
                entry.name: entry.read_text()
                for entry in sorted(folder.iterdir(), key=lambda e: e.name)
                if entry.is_file() and entry.name.endswith(".json")
            }
        )
    return files


def _parse_table(text: str, *, origin: str) -> KernelTable:
    try:
        return KernelTable.parse(text, origin=origin)
    except KernelTableError as error:
        raise SpecProblem("KernelConfigsInvalid", str(error)) from None


def _table_for_shape(text: str, shape: MoeShape, *, origin: str) -> str | None:
    """moelora's table cut to the shape's ops, or None if none.

    The gate_up op has k = hidden and n = 2 x intermediate (both halves at once) or n = intermediate (per slice);
    the down op has k = intermediate and n = hidden.
    """
    table = _parse_table(text, origin=origin)
    hidden, inter, experts = model_shapes.key(shape)
    wanted = {(hidden, 2 * inter, experts), (hidden, inter, experts), (inter, hidden, experts)}
    entries = tuple(e for e in table.entries if (e.k, e.n, e.num_experts) in wanted)
    return table.model_copy(update={"entries": entries}).dump() if entries else None


def _check_user_tables(data: Mapping[str, str], *, gpu: str | None, config_map: str) -> None:
    """A user's ConfigMap: moelora's table in it (the GPU's `<GPU>.json`, or any file shaped like a table) parses,
    else a SpecProblem naming the key and the field. vLLM's own files are vLLM's to read and are not checked."""
    for key, text in data.items():
        if key == f"{gpu}.json" or _looks_like_table(text):
            _parse_table(text, origin=f"ConfigMap {config_map}, key {key}")


def _looks_like_table(text: str) -> bool:
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and "entries" in data  # vLLM's files are keyed by numbers


# vLLM's fused MoE-LoRA nesting: data[max_loras][num_slices][m][rank][hidden][inter] -> leaf
# (moelora.kernels.tools.vllm_configs).
_VLLM_DEPTH = 6
_HIDDEN_LEVEL, _INTER_LEVEL = 4, 5


def _prune(node: Any, depth: int, keep: Mapping[int, set[str]]) -> dict[str, Any] | None:
    """The branches of a vLLM tree whose keys at the levels in `keep` are allowed; None when nothing is left."""
    if not isinstance(node, dict):
        return None
    kept = {}
    for key, child in node.items():
        if depth in keep and key not in keep[depth]:
            continue
        if depth + 1 == _VLLM_DEPTH:
            kept[key] = child
        elif (pruned := _prune(child, depth + 1, keep)) is not None:
            kept[key] = pruned
    return kept or None


def _vllm_file_for_shape(text: str, shape: MoeShape) -> str | None:
    """One of vLLM's per-op files cut to the shape's leaves (hidden key = hidden size, inter key = the
    intermediate size, or twice it for w13 with one slice), or None if none. A file not nested like vLLM's has no
    leaves to match and is left out."""
    inter = shape.moe_intermediate_size
    keep = {_HIDDEN_LEVEL: {str(shape.hidden_size)}, _INTER_LEVEL: {str(inter), str(2 * inter)}}
    tree = _prune(json.loads(text), 0, keep)
    return _dump(tree) if tree else None


def _dump(data: Any) -> str:
    return json.dumps(data, indent=1) + "\n"  # as moelora.kernels writes them


def dense_file_names(gpu: str) -> frozenset[str]:
    """vLLM's per-GPU files for its dense LoRA ops (lora/ops/triton_ops/utils.py: `<GPU>_<OP>[_<ADD_INPUTS>].json`)."""
    return frozenset({f"{gpu}_SHRINK.json", f"{gpu}_EXPAND_TRUE.json", f"{gpu}_EXPAND_FALSE.json"})


def _dense_file(text: str, shape: MoeShape) -> str | None:
    """A dense-op file, whole, if it was tuned for this model: data[max_loras+1][num_slices][m][k][n] has the
    model's hidden size as a shrink input (k: q/k/v and router take it in) or an expand output (n: o puts it out).
    Its other keys are attention sizes the MoE shape does not carry and vLLM takes the nearest key at each level,
    so it is not cut. Tuned for another hidden size (another model's attention): None, vLLM keeps its defaults."""
    data = json.loads(text)
    if not isinstance(data, dict) or not data:
        return None
    hidden = str(shape.hidden_size)
    return _dump(data) if hidden in _keys_at(data, 3) | _keys_at(data, 4) else None


def _keys_at(node: Any, depth: int) -> set[str]:
    if not isinstance(node, dict):
        return set()
    if depth == 0:
        return set(node)
    return set().union(*(_keys_at(child, depth - 1) for child in node.values()))


# vLLM's base fused-MoE files (fused_moe.get_config_file_name): E experts, N one expert's intermediate size, then
# the device and, for quantized weights, the dtype; {token count: launch config} inside.
_BASE_MOE_NAME = re.compile(r"E=(\d+),N=(\d+),device_name=[^,]+(,[^/]*)?\.json")


def base_moe_shape(file_name: str) -> tuple[int, int] | None:
    """(experts, intermediate size) of one of vLLM's base fused-MoE config files, else None."""
    match = _BASE_MOE_NAME.fullmatch(file_name)
    return (int(match[1]), int(match[2])) if match else None


def for_shape(files: Mapping[str, str], shape: MoeShape, *, gpu: str) -> dict[str, str]:
    """read_bundle's files cut to the entries tuned for `shape`; files with none are left out. vLLM's base
    fused-MoE files come whole when their E and N are the shape's (vLLM keys them by nothing else). The dense-op
    files come whole (if tuned for the shape's hidden size), and only with something tuned for the shape: alone
    they do not make a shape bundled."""
    kept: dict[str, str] = {}
    dense: dict[str, str] = {}
    for file_name, text in files.items():
        if (base := base_moe_shape(file_name)) is not None:
            cut, into = (text if base == (shape.num_experts, shape.moe_intermediate_size) else None), kept
        elif file_name in dense_file_names(gpu):
            cut, into = _dense_file(text, shape), dense
        elif file_name == f"{gpu}.json":
            cut, into = _table_for_shape(text, shape, origin=f"bundled {file_name}"), kept
        else:
            cut, into = _vllm_file_for_shape(text, shape), kept
        if cut is not None:
            into[file_name] = cut
    if not kept:
        return {}
    kept |= dense
    return {name: kept[name] for name in files if name in kept}  # in the bundle's order


def bundled_shapes(files: Mapping[str, str], *, gpu: str) -> list[str]:
    """The known models' shapes that have entries in `files`, for a message: 'hiddenSize=.. (model ids)'."""
    ids: dict[tuple[int, int, int], list[str]] = {}
    shapes: dict[tuple[int, int, int], MoeShape] = {}
    for model_id, shape in model_shapes.KNOWN_SHAPES.items():
        ids.setdefault(model_shapes.key(shape), []).append(model_id)
        shapes[model_shapes.key(shape)] = shape
    return [
        f"{model_shapes.describe(shapes[k])} ({', '.join(ids[k])})" for k in ids if for_shape(files, shapes[k], gpu=gpu)
    ]


def content_hash(files: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(files), sort_keys=True).encode()).hexdigest()[:16]


def config_map_key(file_name: str, taken: set[str]) -> str:
    """A valid ConfigMap key for a file name (vLLM's names hold '=' and ','), unique among `taken`."""
    key = _KEY_UNSAFE.sub("_", file_name)
    candidate, n = key, 1
    while candidate in taken:
        n += 1
        candidate = f"{n}-{key}"
    taken.add(candidate)
    return candidate


def owned_config_map_name(name: str) -> str:
    return f"{name}-kernel-configs"


def volume(
    spec: ModelServerSpec,
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    root: Traversable | None,
    user_config_map: Mapping[str, Any] | None = None,
) -> KernelConfigVolume | None:
    """The volume to mount, or None for `none`. `user_config_map` is the fetched ConfigMap (None if absent)."""
    mode = spec.kernels.configs
    if mode == KernelConfigMode.NONE:
        return None
    if mode == KernelConfigMode.CONFIG_MAP:
        cm_name = spec.kernels.config_map_name or ""
        if user_config_map is None:
            raise SpecProblem("ConfigMapNotFound", f"kernel-config ConfigMap {cm_name!r} does not exist")
        data = dict(user_config_map.get("data") or {})
        _check_user_tables(data, gpu=device_name(spec.node_selector), config_map=cm_name)
        return KernelConfigVolume(config_map_name=cm_name, items=None, content_hash=content_hash(data))

    gpu = device_name(spec.node_selector)
    if gpu is None:
        raise SpecProblem(
            "GPUUnknown",
            f"kernels.configs is auto, but nodeSelector has no {GPU_PRODUCT_LABEL} label to pick the tuned set by",
        )
    bundle = read_bundle(gpu, root=root) if root is not None else {}
    if not bundle:
        raise SpecProblem(
            "KernelConfigsNotFound",
            f"no bundled kernel configs for GPU {gpu}; use kernels.configs=configMap with your own, or none",
        )
    shape = model_shapes.model_shape(spec)
    files = for_shape(bundle, shape, gpu=gpu)
    if not files:
        bundled = "; ".join(bundled_shapes(bundle, gpu=gpu)) or "none of a model moelora knows"
        raise SpecProblem(
            "KernelConfigsNotFound",
            f"no bundled kernel configs for GPU {gpu} and the model's shape "
            f"({model_shapes.describe(shape)}); bundled for {gpu}: {bundled}. "
            "Use kernels.configs=configMap with your own, or none",
        )
    size = sum(len(text.encode()) for text in files.values())
    if size > MAX_CONFIG_BYTES:
        raise SpecProblem(
            "KernelConfigsTooLarge",
            f"bundled kernel configs for {gpu} and "
            f"{model_shapes.describe(shape)} are {size} bytes, over a ConfigMap's {MAX_CONFIG_BYTES}",
        )
    taken: set[str] = set()
    keyed = {config_map_key(file_name, taken): (file_name, text) for file_name, text in files.items()}
    cm_name = owned_config_map_name(name)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm_name, "namespace": namespace, "labels": dict(labels)},
        "data": {key: text for key, (_, text) in keyed.items()},
    }
    return KernelConfigVolume(
        config_map_name=cm_name,
        items=[{"key": key, "path": file_name} for key, (file_name, _) in keyed.items()],
        content_hash=content_hash(files),
        owned_config_map=config_map,
    )
