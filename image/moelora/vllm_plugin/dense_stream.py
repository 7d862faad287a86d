"""Dense LoRA on the main stream while the MoE's LoRA keeps vLLM's second stream (CUDA, opt-in).

With `VLLM_LORA_ENABLE_DUAL_STREAM=1` vLLM runs each dense projection's LoRA on an auxiliary stream (a zeroed
buffer, shrink, expand) and the main stream waits for it before adding the result in. At decode sizes that chain is
shorter than the cross-stream join it forces (docs/benchmarks.md, "vLLM end to end"), so with
`MOELORA_DENSE_LORA_STREAM=main` the dual-stream entry point of vLLM's dense LoRA layers runs their single-stream
path instead: shrink, then expand added straight into the base output. The MoE layers are not touched. The entry
point is a custom op that torch.compile does not trace, so compiled graphs and their caches stay valid.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from .patches import Patches

__all__ = ["ENV", "apply_on_main", "install_dense_stream"]

ENV = "MOELORA_DENSE_LORA_STREAM"
ASYNC_PARAMETERS = ("self", "x", "bias")


def apply_on_main(self: Any, x: Any, bias: Any = None) -> Any:
    """What the dual-stream op computes, on the current stream: the base projection with its LoRA added."""
    return self._apply_sync(x, bias)


def install_dense_stream(patches: Patches, layer_class: type | None = None) -> str | None:
    """Route the dual-stream entry point of `layer_class` (vLLM's BaseLinearLayerWithLoRA) through its single-stream
    path when asked; None when done, else why not (nothing changed)."""
    if os.environ.get(ENV, "") != "main":
        return f"not asked ({ENV} is not 'main')"
    from vllm import envs

    if not envs.VLLM_LORA_ENABLE_DUAL_STREAM:
        return "vLLM's dual LoRA stream is off: dense LoRA already runs on the main stream"
    if layer_class is None:
        from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

        layer_class = BaseLinearLayerWithLoRA
    cls: type = layer_class
    for name in ("_apply_async_impl", "_apply_sync"):
        method = getattr(cls, name, None)
        if method is None or tuple(inspect.signature(method).parameters) != ASYNC_PARAMETERS:
            return f"vLLM's {cls.__name__}.{name} is missing or its signature differs from the pinned one"
    patches.set(cls, "_apply_async_impl", apply_on_main)
    return None
