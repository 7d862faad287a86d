"""Where the plugin meets vLLM's second LoRA stream, as data (touchpoints.py says how each kind is checked):
dense_lora's own fork for linear layers and its path without the fork, lora_stream's choice per MoE call (the
parameters of the TritonExperts.apply it wraps are cpu_moe's touchpoint too, listed once in touchpoints.py) and where
vLLM makes the stream (lora_stream.install_stream_priority).
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
_PRIORITY = "lora_stream.install_stream_priority"

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
    Touchpoint(
        "the LoRA stream, made on first use",
        "text",
        ("lora/layers/utils.py",),
        "_get_lora_aux_cuda_stream makes it once, with the dual stream on, on a CUDA-like platform, into a global",
        (
            "_lora_aux_cuda_stream: torch.cuda.Stream | None = None",
            "def _get_lora_aux_cuda_stream() -> torch.cuda.Stream | None:",
            "if not envs.VLLM_LORA_ENABLE_DUAL_STREAM:",
            "if _lora_aux_cuda_stream is None and current_platform.is_cuda_alike():",
        ),
        _PRIORITY,
    ),
    *(
        Touchpoint(
            f"{layer} binds the LoRA-stream getter",
            "text",
            (f"lora/layers/{layer}.py",),
            "a relative import of _get_lora_aux_cuda_stream, called when a layer is made",
            ("from .utils import _get_lora_aux_cuda_stream", "self._lora_stream = _get_lora_aux_cuda_stream()"),
            _PRIORITY,
        )
        for layer in ("base_linear", "fused_moe")
    ),
)
