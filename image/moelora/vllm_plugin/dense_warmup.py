"""Compile vLLM's dense LoRA kernels at start-up instead of in the middle of serving (CUDA only).

vLLM's `lora_shrink` / `lora_expand` Triton kernels are compiled per launch configuration (one per token bucket of
the tuned file, or vLLM's two defaults) and per token-count class (Triton specialises M: 1, a multiple of 16, any
other). Start-up compiles only what the profile run (M = max_num_batched_tokens) and CUDA-graph capture (M <= 32)
touch; the first requests then stall for seconds on the rest (docs/benchmarks-history.md, "vLLM end to end", has the
measurements).

We keep vLLM's implementation and register a thin wrapper as the ops' CUDA kernel: on the first eager call per
weight shape it runs vLLM's own function on scratch buffers at every token bucket of the tuned file (both classes),
then every call goes straight to vLLM's function. The adding expand (`add_inputs=True`) is split at lora_stream's
dense bound: with vLLM's second stream on, only steps above the bound run it (the LoRA added in place; at or below,
the stream's expand writes), so an adding call warms the buckets on its own side of the bound and the first eager
adding call on the other side (vLLM's one-stream path) warms the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from . import warmups_on
from .contract import EXPAND_PARAMETERS, SHRINK_PARAMETERS
from .lora_stream import dense_in_place, dense_max_tokens

__all__ = ["EXPAND_PARAMETERS", "SHRINK_PARAMETERS", "install_dense_warmup", "warm_ms"]

log = logging.getLogger("vllm.moelora_plugin")

# vLLM's defaults switch at 128 tokens (get_lora_op_configs).
_DEFAULT_SWITCH = (1, 128)

_warmed: set[tuple] = set()


# Bucket keys above this are not warmed (the scratch buffers grow with M).
MAX_WARM_M = 16384


def warm_ms(file_ms: set[int], cap: int = MAX_WARM_M) -> list[int]:
    """Token counts that compile every configuration and M class: each bucket key k and k + 1 (1 is its own class,
    k a multiple of 16 or not, k + 1 usually the other), vLLM's default switch points, none above cap."""
    ms = set()
    for k in set(file_ms) | set(_DEFAULT_SWITCH):
        ms |= {k, k + 1}
    return sorted(m for m in ms if 1 <= m <= cap)


def side_ms(ms: list[int], m: int, cap: int = MAX_WARM_M) -> list[int]:
    """The token counts of `ms` on the side of lora_stream's dense bound where a call of m tokens is, and next to the
    bound on that side one count of each class: vLLM takes the nearest bucket's configuration, so one bucket's counts
    can lie on both sides."""
    bound, above = dense_max_tokens(), dense_in_place(m)
    edge = (bound + 1, bound + 2, (bound // 16 + 1) * 16) if above else (bound, bound - 1, bound // 16 * 16)
    return sorted({n for n in (*ms, *edge) if 1 <= n <= cap and dense_in_place(n) == above})


def _file_ms(op_type: str, add_inputs: bool | None) -> set[int]:
    """Every token bucket in vLLM's tuned file for this op (data[max_loras][num_slices][m]...), or none."""
    from vllm.lora.ops.triton_ops.utils import load_lora_op_config

    data = load_lora_op_config(op_type, add_inputs) or {}
    return {int(m) for by_slices in data.values() for by_m in by_slices.values() for m in by_m}


def _meta(max_loras: int, m: int, device: torch.device) -> tuple:
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    meta = LoRAKernelMeta.make(max_loras, m, device=device)
    meta.prepare_tensors(torch.arange(m, device=device, dtype=torch.int32) % max_loras)
    return meta.meta_args(m, False)


# Scratch buffers of one warm-up call are kept under this (an lm_head expand is M x vocab wide).
MAX_SCRATCH_BYTES = 1 << 29


def _should_warm(key: tuple, inputs: torch.Tensor, no_lora_flag_cpu: torch.Tensor) -> bool:
    if key in _warmed or not warmups_on() or inputs.device.type != "cuda":
        return False
    # Not during a batch without adapters (vLLM's memory-profiling run is one: scratch buffers there would count
    # toward its peak), nor inside graph capture; the next eager call with adapters warms.
    if bool(no_lora_flag_cpu.item()) or torch.cuda.is_current_stream_capturing():
        return False
    _warmed.add(key)
    return True


def _cap(token_lora_mapping: torch.Tensor, row_bytes: int) -> int:
    """The largest token count to warm: what vLLM's metadata buffer holds (max_num_batched_tokens; the mapping is
    a view of it) and what keeps one call's scratch under MAX_SCRATCH_BYTES."""
    capacity = token_lora_mapping.untyped_storage().nbytes() // token_lora_mapping.element_size()
    return max(1, min(capacity, MAX_WARM_M, MAX_SCRATCH_BYTES // max(1, row_bytes)))


def _compile_at(ms: list[int], dev: torch.device, what: str, call: Callable[[int], None]) -> None:
    """vLLM's op once at each token count (call(m) on scratch buffers), so each variant compiles now."""
    t0 = time.monotonic()
    for m in ms:
        call(m)
    torch.cuda.synchronize(dev)
    log.info("moelora: vLLM's %s compiled, M in %s, in %.1f s", what, ms, time.monotonic() - t0)


def make_shrink(original: Callable[..., None]) -> Callable[..., None]:
    def lora_shrink(
        inputs,
        lora_a_weights,
        output_tensor,
        token_lora_mapping,
        token_indices_sorted_by_lora_ids,
        num_tokens_per_lora,
        lora_token_start_loc,
        lora_ids,
        no_lora_flag_cpu,
        num_active_loras,
        scaling,
    ):
        key = ("shrink", tuple(tuple(w.shape) for w in lora_a_weights), inputs.dtype, lora_ids.size(0))
        if _should_warm(key, inputs, no_lora_flag_cpu):
            dev, k = inputs.device, inputs.size(1)
            row_bytes = k * inputs.element_size() + len(lora_a_weights) * output_tensor.size(-1) * 4

            def on_scratch(m: int) -> None:
                out = torch.zeros(len(lora_a_weights), m, output_tensor.size(-1), device=dev, dtype=output_tensor.dtype)
                original(
                    torch.zeros(m, k, device=dev, dtype=inputs.dtype),
                    lora_a_weights,
                    out,
                    *_meta(lora_ids.size(0) - 1, m, dev),
                    scaling,
                )

            _compile_at(
                warm_ms(_file_ms("shrink", None), cap=_cap(token_lora_mapping, row_bytes)),
                dev,
                f"lora_shrink for K={k}, {len(lora_a_weights)} slice(s)",
                on_scratch,
            )
        original(
            inputs,
            lora_a_weights,
            output_tensor,
            token_lora_mapping,
            token_indices_sorted_by_lora_ids,
            num_tokens_per_lora,
            lora_token_start_loc,
            lora_ids,
            no_lora_flag_cpu,
            num_active_loras,
            scaling,
        )

    lora_shrink.__qualname__ = "moelora_warm_lora_shrink"
    return lora_shrink


def make_expand(original: Callable[..., None]) -> Callable[..., None]:
    def lora_expand(
        inputs,
        lora_b_weights,
        output_tensor,
        token_lora_mapping,
        token_indices_sorted_by_lora_ids,
        num_tokens_per_lora,
        lora_token_start_loc,
        lora_ids,
        no_lora_flag_cpu,
        num_active_loras,
        offset_start=0,
        add_inputs=False,
    ):
        key = (
            "expand",
            tuple(tuple(w.shape) for w in lora_b_weights),
            inputs.dtype,
            output_tensor.dtype,
            output_tensor.size(-1),
            offset_start,
            bool(add_inputs),
            lora_ids.size(0),
            dense_in_place(inputs.size(1)) if add_inputs else None,  # the adding expand warms one side at a time
        )
        if _should_warm(key, inputs, no_lora_flag_cpu):
            dev, n = inputs.device, output_tensor.size(-1)
            row_bytes = inputs.size(0) * inputs.size(2) * inputs.element_size() + n * output_tensor.element_size()
            cap = _cap(token_lora_mapping, row_bytes)
            ms = warm_ms(_file_ms("expand", bool(add_inputs)), cap=cap)
            if add_inputs:
                ms = side_ms(ms, inputs.size(1), cap)

            def on_scratch(m: int) -> None:
                part = torch.zeros(inputs.size(0), m, inputs.size(2), device=dev, dtype=inputs.dtype)
                original(
                    part,
                    lora_b_weights,
                    torch.zeros(m, n, device=dev, dtype=output_tensor.dtype),
                    *_meta(lora_ids.size(0) - 1, m, dev),
                    offset_start=offset_start,
                    add_inputs=add_inputs,
                )

            _compile_at(
                ms,
                dev,
                f"lora_expand for N={n}, {len(lora_b_weights)} slice(s)",
                on_scratch,
            )
        original(
            inputs,
            lora_b_weights,
            output_tensor,
            token_lora_mapping,
            token_indices_sorted_by_lora_ids,
            num_tokens_per_lora,
            lora_token_start_loc,
            lora_ids,
            no_lora_flag_cpu,
            num_active_loras,
            offset_start=offset_start,
            add_inputs=add_inputs,
        )

    lora_expand.__qualname__ = "moelora_warm_lora_expand"
    return lora_expand


def install_dense_warmup(override: Callable[[str, Callable[..., None]], None]) -> str | None:
    """Register the warming wrappers as the CUDA kernels of vllm::lora_shrink / lora_expand through `override(op
    name, fn)`; None when done, else why not (nothing changed)."""
    import inspect

    from vllm.lora.ops.triton_ops import lora_expand_op, lora_shrink_op

    pairs = (
        ("lora_shrink", lora_shrink_op, "_lora_shrink", SHRINK_PARAMETERS, make_shrink),
        ("lora_expand", lora_expand_op, "_lora_expand", EXPAND_PARAMETERS, make_expand),
    )
    for op_name, module, fn_name, params, _ in pairs:
        fn = getattr(module, fn_name, None)
        if fn is None or tuple(inspect.signature(fn).parameters) != params:
            return f"vLLM's {fn_name} is missing or its signature differs from the pinned one"
        packet = getattr(torch.ops.vllm, op_name, None)
        if packet is None or tuple(a.name for a in packet.default._schema.arguments) != params:
            return f"torch.ops.vllm.{op_name} is missing or its schema differs"
    for op_name, module, fn_name, _, make in pairs:
        override(op_name, make(getattr(module, fn_name)))
    return None


def reset() -> None:
    _warmed.clear()
