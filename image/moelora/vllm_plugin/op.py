"""Our implementation of vLLM's `fused_moe_lora` op, with vLLM's exact parameters (contract.PARAMETERS).

`make_op(original=..., backend=...)` returns the function registered in place of vLLM's kernel. Per call it turns
vLLM's arguments into our layout (layout.py: topk_ids from the naive or blocked routing; the w13 op's slices are
column views of the output) and runs, per slice, moelora.kernels' Triton op on CUDA or the torch path on the
CPU. What we do not cover — fully sharded LoRA (it all-reduces the rank intermediate between the two halves), rank
above 128, a device with no backend — goes to vLLM's own implementation, logged once per reason.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from .layout import topk_ids_from_vllm
from .torch_path import moe_lora_torch

__all__ = ["make_op"]

# A child of vLLM's logger, so our lines use its handler and format inside the server.
log = logging.getLogger("vllm.moelora_plugin")

_MAX_RANK = 128


class _Once:
    """Log each distinct message once per process."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, level: int, msg: str) -> None:
        if msg not in self._seen:
            self._seen.add(msg)
            log.log(level, "%s", msg)


def make_op(*, original: Callable[..., None], backend: str) -> Callable[..., None]:
    """The replacement op. backend: "triton" (moelora.kernels on CUDA) or "torch" (torch_path, any device)."""
    once = _Once()
    if backend == "triton":
        from .triton_path import Router, run_triton

        router = Router()
    elif backend != "torch":
        raise ValueError(f"unknown backend {backend!r}")

    def fused_moe_lora(
        output: torch.Tensor,
        qcurr_hidden_states: torch.Tensor,
        lora_a_stacked: list[torch.Tensor],
        lora_b_stacked: list[torch.Tensor],
        topk_weights: torch.Tensor,
        sorted_token_ids: torch.Tensor | None,
        expert_ids: torch.Tensor,
        num_tokens_post_padded: torch.Tensor | None,
        token_lora_mapping: torch.Tensor,
        max_lora_rank: int,
        top_k_num: int,
        lora_ids: torch.Tensor,
        num_active_loras: torch.Tensor,
        adapter_enabled: torch.Tensor,
        shrink_block_size_m: int,
        shrink_block_size_n: int,
        shrink_block_size_k: int,
        shrink_group_size_m: int,
        shrink_num_warps: int,
        shrink_num_stages: int,
        shrink_split_k: int,
        expand_block_size_m: int,
        expand_block_size_n: int,
        expand_block_size_k: int,
        expand_group_size_m: int,
        expand_num_warps: int,
        expand_num_stages: int,
        expand_split_k: int,
        mul_routed_weight: bool = False,
        fully_sharded: bool = False,
        offset: int = 0,
        add_inputs: bool = True,
    ) -> None:
        reason = _unsupported(
            fully_sharded=fully_sharded,
            offset=offset,
            max_lora_rank=max_lora_rank,
            device=output.device,
            backend=backend,
        )
        if reason is not None:
            once(logging.INFO, f"moelora: vLLM's own fused_moe_lora kernel for this call ({reason})")
            original(
                output,
                qcurr_hidden_states,
                lora_a_stacked,
                lora_b_stacked,
                topk_weights,
                sorted_token_ids,
                expert_ids,
                num_tokens_post_padded,
                token_lora_mapping,
                max_lora_rank,
                top_k_num,
                lora_ids,
                num_active_loras,
                adapter_enabled,
                shrink_block_size_m,
                shrink_block_size_n,
                shrink_block_size_k,
                shrink_group_size_m,
                shrink_num_warps,
                shrink_num_stages,
                shrink_split_k,
                expand_block_size_m,
                expand_block_size_n,
                expand_block_size_k,
                expand_group_size_m,
                expand_num_warps,
                expand_num_stages,
                expand_split_k,
                mul_routed_weight,
                fully_sharded,
                offset,
                add_inputs,
            )
            return
        once(logging.INFO, f"moelora: fused_moe_lora runs on the moelora {backend} kernel ({output.device.type})")
        m, top_k = topk_weights.shape
        mapping = token_lora_mapping[:m]

        def topk_ids() -> torch.Tensor:
            return topk_ids_from_vllm(
                sorted_token_ids=sorted_token_ids,
                expert_ids=expert_ids,
                num_tokens_post_padded=num_tokens_post_padded,
                token_lora_mapping=mapping,
                num_tokens=m,
                top_k=top_k,
                block_m=shrink_block_size_m,
            )

        with torch.inference_mode():
            # w13 passes the layer input, one row per token; w2 the activations, one row per (token, slot).
            x = qcurr_hidden_states
            if x.shape[0] == m * top_k and top_k > 1:
                x = x.reshape(m, top_k, x.shape[-1])
            out = output.view(m, top_k, -1)
            if not add_inputs:
                out.zero_()
            width = lora_b_stacked[0].shape[2]
            slices = [
                (out[:, :, i * width : (i + 1) * width], a, b)
                for i, (a, b) in enumerate(zip(lora_a_stacked, lora_b_stacked))
            ]
            if backend == "torch":
                ids = topk_ids()
                for out_i, a, b in slices:
                    moe_lora_torch(
                        output=out_i,
                        x=x,
                        lora_a=a,
                        lora_b=b,
                        topk_ids=ids,
                        token_lora_mapping=mapping,
                        topk_weights=topk_weights,
                        mul_routed_weight=mul_routed_weight,
                    )
                return
            max_loras, num_experts = lora_a_stacked[0].shape[:2]
            key = (
                expert_ids.data_ptr(),
                0 if sorted_token_ids is None else sorted_token_ids.data_ptr(),
                mapping.data_ptr(),
                m,
                top_k,
                num_experts,
                max_loras,
            )
            routing = router.route(
                key=key,
                reuse=mul_routed_weight,
                make_topk_ids=topk_ids,
                token_lora_mapping=mapping,
                num_experts=num_experts,
                max_loras=max_loras,
            )
            for out_i, a, b in slices:
                run_triton(
                    output=out_i,
                    x=x,
                    lora_a=(a,),
                    lora_b=(b,),
                    routing=routing,
                    topk_weights=topk_weights,
                    mul_routed_weight=mul_routed_weight,
                )

    fused_moe_lora.__qualname__ = "moelora_fused_moe_lora"
    return fused_moe_lora


def _unsupported(
    *, fully_sharded: bool, offset: int, max_lora_rank: int, device: torch.device, backend: str
) -> str | None:
    if fully_sharded or offset:
        return "fully sharded LoRA"
    if max_lora_rank > _MAX_RANK:
        return f"rank {max_lora_rank} > {_MAX_RANK}"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"no Triton backend on {device.type}"
    return None
