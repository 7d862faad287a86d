"""Our kernel one level above the op: vLLM's `PunicaWrapperGPU.add_lora_w13` and `add_lora_w2` (CUDA only).

vLLM's add_lora_w13 receives the layer's `topk_ids` and runs its own align kernel (moe_lora_align_block_size, most
of a decode step's MoE-LoRA bookkeeping) only to hand the fused_moe_lora op a blocked layout, which the op-level
plugin then inverts back to topk_ids (layout.py). Hooked here, our routing is built straight from topk_ids and both
are skipped. The w13 call returns vLLM's four routing values as (None, None, None, token_lora_mapping): vLLM only
passes them on to the same layer's add_lora_w2, which is hooked too and takes that form as "the w13 call was ours"
and reuses the routing kept from it (the two calls follow each other on one stream, at run time and during
CUDA-graph capture alike). Whatever we do not cover (expert parallelism, fully sharded LoRA, shared-expert-dim LoRA,
rank > 128) goes to vLLM's own methods, whose fused_moe_lora op is still ours.

The first eager call per layer shape also compiles every kernel variant the layer can launch (warm-up): at each
token count where a launch choice changes, one routing and on it the w13 op then the w2 op, as served, so no
request later pays a Triton compile.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import warmups_on
from .contract import W2_PARAMETERS, W13_PARAMETERS
from .patches import Patches

if TYPE_CHECKING:
    from moelora.kernels import MoeLoraRouting

__all__ = ["W2_PARAMETERS", "W13_PARAMETERS", "install_moe_hooks"]

log = logging.getLogger("vllm.moelora_plugin")

_MAX_RANK = 128

_originals: dict[str, Callable[..., object]] = {}


@dataclass
class _Kept:
    """The routing of the last w13 call, for the w2 call of the same layer."""

    routing: MoeLoraRouting | None = None
    mapping_ptr: int = -1
    num_tokens: int = -1
    # What the w2 call's warm-up needs of the w13 op: its (lora_a slices, lora_b slices), input dtype, ids dtype.
    w13: tuple | None = None


_kept = _Kept()
_warmed: set[tuple] = set()


def _unsupported(lora_a_stacked, expert_map, fully_sharded: bool, x: torch.Tensor) -> str | None:
    if fully_sharded:
        return "fully sharded LoRA"
    if expert_map is not None:
        return "expert parallelism"
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"no Triton backend on {x.device.type}"
    a = lora_a_stacked[0]
    if a.shape[2] > _MAX_RANK:
        return f"rank {a.shape[2]} > {_MAX_RANK}"
    if a.stride(1) == 0:
        return "LoRA A shared across experts"
    if len(lora_a_stacked) > 2:
        return f"{len(lora_a_stacked)} slices"
    return None


def _token_mapping(wrapper, token_lora_mapping: torch.Tensor | None, num_tokens: int) -> tuple[torch.Tensor, bool]:
    """The batch's token -> adapter-slot map and whether no token has an adapter, as vLLM's add_lora_fused_moe
    reads them. With no adapter in the batch vLLM does not even refresh the map (LoRAKernelMeta.prepare_tensors
    returns first), so it must not be read then: it still holds an earlier batch's slots."""
    meta = wrapper.token_mapping_meta.meta_args(num_tokens, wrapper.lora_config.specialize_active_lora)
    if token_lora_mapping is None:
        token_lora_mapping = meta[0]
    return token_lora_mapping[:num_tokens], bool(meta[5].item())  # meta[5]: a CPU tensor, no device sync


def add_lora_w13(
    self,
    y,
    x,
    lora_a_stacked,
    lora_b_stacked,
    topk_ids,
    topk_weights,
    expert_map,
    w1,
    w2,
    num_tokens,
    top_k_num,
    max_loras,
    adapter_enabled,
    local_num_experts,
    top_k,
    num_slices,
    fully_sharded,
    use_tuned_config,
    add_inputs=True,
    token_lora_mapping=None,
):
    reason = _unsupported(lora_a_stacked, expert_map, fully_sharded, x)
    if reason is not None:
        _kept.routing = None
        _once(f"moelora: vLLM's add_lora_w13 for this layer ({reason})")
        return _originals["add_lora_w13"](
            self,
            y,
            x,
            lora_a_stacked,
            lora_b_stacked,
            topk_ids,
            topk_weights,
            expert_map,
            w1,
            w2,
            num_tokens,
            top_k_num,
            max_loras,
            adapter_enabled,
            local_num_experts,
            top_k,
            num_slices,
            fully_sharded,
            use_tuned_config,
            add_inputs=add_inputs,
            token_lora_mapping=token_lora_mapping,
        )
    from .triton_path import route, run_triton

    mapping, no_lora = _token_mapping(self, token_lora_mapping, num_tokens)
    _kept.routing = None
    if no_lora:  # as vLLM: nothing to add (and with add_inputs=False its callers pass a zeroed buffer)
        return None, None, None, mapping
    ids = topk_ids.view(num_tokens, -1)
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int32)
    routing = route(
        topk_ids=ids,
        token_lora_mapping=mapping,
        num_experts=lora_a_stacked[0].shape[1],
        max_loras=lora_a_stacked[0].shape[0],
    )
    # add_inputs=False: vLLM's callers (its Triton and TRT-LLM experts) pass a delta buffer they zeroed on the main
    # stream before the LoRA stream forks, so adding into it writes the delta; a second fill would only cost a launch.
    out = y.view(num_tokens, ids.shape[1], -1)
    # One op for all slices (Qwen3's gate and up): one shrink and one expand launch, each slice its output columns.
    run_triton(
        output=out,
        x=x,
        lora_a=tuple(lora_a_stacked),
        lora_b=tuple(lora_b_stacked),
        routing=routing,
        topk_weights=topk_weights,
        mul_routed_weight=False,
    )
    _kept.routing, _kept.mapping_ptr, _kept.num_tokens = routing, mapping.data_ptr(), num_tokens
    _kept.w13 = (tuple(lora_a_stacked), tuple(lora_b_stacked), x.dtype, ids.dtype)
    _once("moelora: MoE LoRA runs from topk_ids (vLLM's align kernel skipped)")
    return None, None, None, mapping


def add_lora_w2(
    self,
    y,
    x,
    lora_a_stacked,
    lora_b_stacked,
    topk_weights,
    sorted_token_ids_lora,
    expert_ids_lora,
    num_tokens_post_padded_lora,
    token_lora_mapping,
    num_tokens,
    w1,
    w2,
    top_k_num,
    max_loras,
    adapter_enabled,
    top_k,
    fully_sharded,
    tp_rank,
    use_tuned_config,
    add_inputs=True,
):
    ours = (
        sorted_token_ids_lora is None
        and expert_ids_lora is None
        and token_lora_mapping is not None
        and _kept.routing is not None
        and _kept.mapping_ptr == token_lora_mapping.data_ptr()
        and _kept.num_tokens == num_tokens
    )
    if not ours:
        return _originals["add_lora_w2"](
            self,
            y,
            x,
            lora_a_stacked,
            lora_b_stacked,
            topk_weights,
            sorted_token_ids_lora,
            expert_ids_lora,
            num_tokens_post_padded_lora,
            token_lora_mapping,
            num_tokens,
            w1,
            w2,
            top_k_num,
            max_loras,
            adapter_enabled,
            top_k,
            fully_sharded,
            tp_rank,
            use_tuned_config,
            add_inputs=add_inputs,
        )
    from .triton_path import run_triton

    routing, _kept.routing = _kept.routing, None
    assert routing is not None and _kept.w13 is not None  # ours: the w13 call kept both
    top = routing.top_k
    _warm_up(
        w13=_kept.w13,
        lora_a=lora_a_stacked[0],
        lora_b=lora_b_stacked[0],
        top_k=top,
        x=x,
        topk_weights=topk_weights,
        mapping=token_lora_mapping,
    )
    out = y.view(num_tokens, top, -1)  # add_inputs=False: a zeroed delta buffer, as for w13
    run_triton(
        output=out,
        x=x.reshape(num_tokens, top, x.shape[-1]),
        lora_a=(lora_a_stacked[0],),
        lora_b=(lora_b_stacked[0],),
        routing=routing,
        topk_weights=topk_weights.view(num_tokens, top),
        mul_routed_weight=True,
    )
    return None


def _warm_up(
    *,
    w13: tuple,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    top_k: int,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    mapping: torch.Tensor,
) -> None:
    """Compile, once per layer shape and outside CUDA-graph capture, every kernel variant the layer can launch. At
    each of _warm_ms, on scratch buffers laid out as the real ones: one routing, the w13 op on it, then the w2 op on
    the same routing, as add_lora_w13 and add_lora_w2 run them. The w2 op must follow a w13 op: the second op on a
    routing is another variant (it reads the settled routing before its wait, and uses the next readiness slot)."""
    if not warmups_on() or not _compiles_on(x.device):
        return
    if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return
    a13, b13, x13_dtype, ids_dtype = w13
    key = (
        tuple(a13[0].shape),
        tuple(b13[0].shape),
        len(a13),
        tuple(lora_a.shape),
        tuple(lora_b.shape),
        top_k,
        x13_dtype,
        ids_dtype,
        x.dtype,
        topk_weights.dtype,
        mapping.dtype,
        x.device,
    )
    if key in _warmed:
        return
    _warmed.add(key)
    import time

    from .triton_path import route, run_triton

    max_loras, experts, rank, k2 = lora_a.shape
    k13, n13, n2 = a13[0].shape[3], b13[0].shape[2], lora_b.shape[2]
    dev = x.device
    t0 = time.monotonic()
    ms = _warm_ms(top_k=top_k, device=dev)
    for m in ms:
        g = torch.Generator(device=dev).manual_seed(m)
        ids = torch.randint(0, experts, (m, top_k), device=dev, generator=g, dtype=ids_dtype)
        slots = (torch.arange(m, device=dev) % max_loras).to(mapping.dtype)
        routing = route(topk_ids=ids, token_lora_mapping=slots, num_experts=experts, max_loras=max_loras)
        weights = torch.full((m, top_k), 1.0 / top_k, device=dev, dtype=topk_weights.dtype)
        run_triton(
            output=torch.zeros(m, top_k, len(a13) * n13, device=dev, dtype=x13_dtype),
            x=torch.zeros(m, k13, device=dev, dtype=x13_dtype),
            lora_a=a13,
            lora_b=b13,
            routing=routing,
            topk_weights=weights,
            mul_routed_weight=False,
        )
        run_triton(
            output=torch.zeros(m, top_k, n2, device=dev, dtype=x.dtype),
            x=torch.zeros(m, top_k, k2, device=dev, dtype=x.dtype),
            lora_a=(lora_a,),
            lora_b=(lora_b,),
            routing=routing,
            topk_weights=weights,
            mul_routed_weight=True,
        )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    log.info(
        "moelora: MoE-LoRA kernels compiled for M in %s (E=%d, K=%d/%d, N=%d/%d, rank %d, %d adapters) in %.1f s",
        list(ms),
        experts,
        k13,
        k2,
        n13,
        n2,
        rank,
        max_loras,
        time.monotonic() - t0,
    )


def _compiles_on(device: torch.device) -> bool:
    """Whether a launch on this device compiles a kernel (CUDA); Triton's interpreter compiles nothing."""
    return device.type == "cuda"


def _warm_ms(*, top_k: int, device: torch.device) -> tuple[int, ...]:
    """Token counts where a launch choice can change: the buckets of the config table default_config reads on this
    device (plus 1 and 16 if absent), and each side of every routing switch (routing_switches, in pairs)."""
    from moelora.kernels import routing_switches, table_token_counts

    ms = {1, 16, *table_token_counts(device)}
    for pairs in routing_switches():
        ms |= {m for m in (pairs // top_k, pairs // top_k + 1) if m >= 1}
    return tuple(sorted(ms))


_seen: set[str] = set()


def _once(msg: str) -> None:
    if msg not in _seen:
        _seen.add(msg)
        log.info("%s", msg)


def install_moe_hooks(cls: type, patches: Patches) -> str | None:
    """Hook cls.add_lora_w13 / add_lora_w2 (PunicaWrapperGPU) through `patches`; None when done, else why not
    (nothing changed)."""
    import inspect

    for name, want in (("add_lora_w13", W13_PARAMETERS), ("add_lora_w2", W2_PARAMETERS)):
        fn = cls.__dict__.get(name)
        if fn is None:
            return f"{cls.__name__} has no {name}"
        got = tuple(inspect.signature(fn).parameters)
        if got != want:
            return f"{cls.__name__}.{name} signature differs from the pinned one"
    for name, hook in (("add_lora_w13", add_lora_w13), ("add_lora_w2", add_lora_w2)):
        _originals[name] = cls.__dict__[name]
        patches.set(cls, name, hook)
    patches.on_undo(_forget)
    return None


def _forget() -> None:
    """Drop what the hooks hold: vLLM's originals, the kept routing and the warmed shapes."""
    _originals.clear()
    _kept.routing = _kept.w13 = None
    _warmed.clear()
