"""Where the plugin meets vLLM's second LoRA stream, as data (touchpoints.py says how each kind is checked):
dense_lora's own fork for linear layers and its path without the fork, dense_fold's weights folded at the LoRA
manager's start (vLLM must keep writing lora_a in place and reading the base weight through the layer), and
lora_stream's choice per MoE call (the parameters of the TritonExperts.apply it wraps are cpu_moe's touchpoint too,
listed once in touchpoints.py).
Stdlib only, like contract.py.
"""

from __future__ import annotations

from .contract import (
    APPLY_ASYNC_PARAMETERS,
    APPLY_SYNC_PARAMETERS,
    PARALLEL_PARAMETERS,
    Touchpoint,
)

__all__ = ["STREAMS"]

_TRITON_EXPERTS = "model_executor/layers/fused_moe/experts/triton_moe.py"

STREAMS: tuple[Touchpoint, ...] = (
    Touchpoint(
        "BaseLinearLayerWithLoRA._apply_async_impl",
        "params",
        ("lora/layers/base_linear.py",),
        "BaseLinearLayerWithLoRA._apply_async_impl",
        APPLY_ASYNC_PARAMETERS,
        "dense_lora (apply_async replaces it)",
    ),
    Touchpoint(
        "the LoRA-stream fork's parts",
        "text",
        ("lora/layers/base_linear.py",),
        "base on the current stream, LoRA into a zeroed output on the LoRA stream, added after the join",
        (
            "self._get_quant_method().apply(self.base_layer, x, bias)",
            "self._events[0],",
            "self._lora_stream,",
            "output.add_(lora_result)",
        ),
        "dense_lora.apply_async",
    ),
    Touchpoint(
        "maybe_execute_in_parallel",
        "params",
        ("utils/multi_stream_utils.py",),
        "maybe_execute_in_parallel",
        PARALLEL_PARAMETERS,
        "dense_lora.apply_async",
    ),
    Touchpoint(
        "BaseLinearLayerWithLoRA._apply_sync",
        "params",
        ("lora/layers/base_linear.py",),
        "BaseLinearLayerWithLoRA._apply_sync",
        APPLY_SYNC_PARAMETERS,
        "dense_lora.apply_async (above lora_stream's bound)",
    ),
    Touchpoint(
        "LoRAModelManager._create_lora_modules",
        "params",
        ("lora/model_manager.py",),
        "LoRAModelManager._create_lora_modules",
        ("self",),
        "dense_fold (folds the layers it made)",
    ),
    Touchpoint(
        "lora_a written in place",
        "text",
        ("lora/layers/base_linear.py",),
        "reset_lora and set_lora write into lora_a_stacked, never rebind it",
        (
            "self.lora_a_stacked[s_index][index] = 0",
            "self.lora_a_stacked[0][index, 0, : lora_a.shape[0], : lora_a.shape[1]].copy_(",
        ),
        "dense_fold (lora_a are views into the folded weight)",
    ),
    Touchpoint(
        "sliced layers' lora_a written in place",
        "text",
        ("lora/layers/column_parallel_linear.py",),
        "MergedColumnParallelLinearWithLoRA.set_lora writes each slice's lora_a in place",
        ("self.lora_a_stacked[i][", "].copy_(lora_a_i, non_blocking=True)"),
        "dense_fold (lora_a are views into the folded weight)",
    ),
    Touchpoint(
        "the unquantized GEMM reads the layer's weight",
        "text",
        ("model_executor/layers/linear.py",),
        "UnquantizedLinearMethod.apply passes layer.weight to its GEMM",
        ("(layer, x, layer.weight, bias)",),
        "dense_fold (the weight is a view into the folded weight)",
    ),
    Touchpoint(
        "env VLLM_BATCH_INVARIANT",
        "env",
        ("envs.py",),
        "VLLM_BATCH_INVARIANT",
        used_by="dense_fold (off in batch-invariant mode)",
    ),
    Touchpoint(
        "the MoE LoRA's stream, chosen per call",
        "text",
        (_TRITON_EXPERTS,),
        "TritonExperts.apply forks only while its LoRA context has a stream",
        ("if lora_context is not None and lora_context.aux_stream is not None:",),
        "lora_stream",
    ),
    Touchpoint(
        "MoELoRAContext's stream and events",
        "fields",
        ("model_executor/layers/fused_moe/experts/lora_context.py",),
        "MoELoRAContext",
        ("aux_stream", "events"),
        "lora_stream",
    ),
)
