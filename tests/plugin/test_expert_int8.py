"""expert_int8: a MoE LoRA layer's int8 copy of its adapter slots, kept current by vLLM's own slot writes and served
by the hooks in place of vLLM's weights (Triton's interpreter), and its install on the installed vLLM's layers."""

from __future__ import annotations

import pytest
import torch

from moelora.kernels import dequantize_expert_lora, moe_lora_reference, quantize_expert_lora
from moelora.vllm_plugin import expert_int8
from moelora.vllm_plugin.patches import Patches

from .test_hooks import _layer, _w2, _w13


class _VllmLikeLayer:
    """What expert_int8 reads of vLLM's FusedMoEWithLoRA: its stacked slots, and set_lora / reset_lora writing
    them in place (vLLM copies an adapter into its slot and zeroes a slot it frees)."""

    def __init__(self, layer):
        self.w13_lora_a_stacked, self.w13_lora_b_stacked = layer.a13, layer.b13
        self.w2_lora_a_stacked, self.w2_lora_b_stacked = layer.a2, layer.b2
        self.writes = 0

    def set_lora(self, index, lora_a, lora_b):
        self.writes += 1
        for stacked, new in zip((*self.w13_lora_a_stacked, *self.w2_lora_a_stacked), lora_a, strict=True):
            stacked[index].copy_(new)
        for stacked, new in zip((*self.w13_lora_b_stacked, *self.w2_lora_b_stacked), lora_b, strict=True):
            stacked[index].copy_(new)

    def reset_lora(self, index):
        for t in (*self.w13_lora_a_stacked, *self.w13_lora_b_stacked, *self.w2_lora_a_stacked, *self.w2_lora_b_stacked):
            t[index] = 0


@pytest.fixture(autouse=True)
def _forget_copies():
    yield
    expert_int8._forget()


def _dequantized(a, b):
    return dequantize_expert_lora(*quantize_expert_lora(a, b))


def _want(layer, slices):
    n13 = 2 * layer.inter // slices
    out13 = layer.y13.view(layer.m, layer.top_k, -1)
    route = {"topk_ids": layer.topk_ids, "token_lora_mapping": layer.mapping, "topk_weights": layer.topk_w}
    parts = []
    for i, (a, b) in enumerate(zip(layer.a13, layer.b13, strict=True)):
        da, db = _dequantized(a, b)
        parts.append(
            moe_lora_reference(output=out13[:, :, i * n13 : (i + 1) * n13], x=layer.x, lora_a=da, lora_b=db, **route)
        )
    da2, db2 = _dequantized(layer.a2[0], layer.b2[0])
    want2 = moe_lora_reference(
        output=layer.y2,
        x=layer.act.view(layer.m, layer.top_k, -1),
        lora_a=da2,
        lora_b=db2,
        mul_routed_weight=True,
        **route,
    )
    return torch.cat(parts, dim=-1), want2


def _every_slot(vllm_layer, layer):
    for i in range(layer.loras):
        a = [t[i].clone() for t in (*layer.a13, *layer.a2)]
        b = [t[i].clone() for t in (*layer.b13, *layer.b2)]
        vllm_layer.set_lora(i, a, b)


@pytest.mark.parametrize("slices", [1, 2])
def test_the_hooks_serve_the_int8_copy_that_vllms_slot_writes_keep_current(slices):
    layer = _layer(slices=slices, seed=slices)
    vllm_layer = _VllmLikeLayer(layer)
    assert expert_int8.add_copies(vllm_layer) is None
    _every_slot(vllm_layer, layer)  # vLLM's slots start at zero; set_lora fills them (and now the copies)
    assert vllm_layer.writes == layer.loras  # vLLM's own write ran once per call
    want13, want2 = _want(layer, slices)
    exact13 = layer.y13.clone()
    _w2(layer, _w13(layer))
    torch.testing.assert_close(layer.y13.double(), want13, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer.y2.double(), want2, rtol=1e-4, atol=1e-4)
    assert not torch.equal(layer.y13, exact13)


def test_a_freed_slot_adds_nothing_and_a_new_adapter_is_served_at_once():
    layer = _layer(slices=2, seed=4)
    vllm_layer = _VllmLikeLayer(layer)
    expert_int8.add_copies(vllm_layer)
    _every_slot(vllm_layer, layer)
    vllm_layer.reset_lora(1)
    slot1 = layer.mapping == 1
    before = layer.y13.clone()
    _w2(layer, _w13(layer))
    assert slot1.any() and torch.equal(
        layer.y13.view(layer.m, layer.top_k, -1)[slot1], before.view(layer.m, layer.top_k, -1)[slot1]
    )
    # A new adapter in slot 1, written the way vLLM writes it: served from the next call on.
    fresh = _layer(slices=2, seed=9)
    vllm_layer.set_lora(
        1, [t[1].clone() for t in (*fresh.a13, *fresh.a2)], [t[1].clone() for t in (*fresh.b13, *fresh.b2)]
    )
    before = layer.y13.clone()
    want13, _ = _want(layer, 2)
    _w2(layer, _w13(layer))
    torch.testing.assert_close(layer.y13.double(), want13, rtol=1e-4, atol=1e-4)
    assert not torch.equal(
        layer.y13.view(layer.m, layer.top_k, -1)[slot1], before.view(layer.m, layer.top_k, -1)[slot1]
    )


def test_weights_without_a_copy_are_served_as_they_are():
    layer = _layer(slices=2)
    a, b, scale = expert_int8.int8_weights(layer.a13, layer.b13)
    assert a is layer.a13 and b is layer.b13 and scale is None


def test_a_layer_whose_a_is_shared_across_experts_keeps_its_weights():
    layer = _layer(slices=1)
    shared = _VllmLikeLayer(layer)
    shared.w13_lora_a_stacked = (layer.a13[0][:, :1],)  # one A for every expert: (L, 1, r, K)
    assert "not (L, E, r, K)" in expert_int8.add_copies(shared)
    assert expert_int8.int8_weights(layer.a13, layer.b13)[2] is None


def test_install_pins_vllms_moe_lora_layers_and_undoes(monkeypatch):
    from vllm.lora.layers import fused_moe

    patches = Patches()
    monkeypatch.delenv(expert_int8.ENV, raising=False)
    assert expert_int8.install_expert_int8(patches) == f"{expert_int8.ENV} is not int8"
    monkeypatch.setenv(expert_int8.ENV, "fp8")
    assert "is not model or int8" in expert_int8.install_expert_int8(patches)
    assert not patches.done
    monkeypatch.setenv(expert_int8.ENV, "int8")
    originals = {
        c: c.__dict__["create_lora_weights"] for c in (fused_moe.FusedMoEWithLoRA, fused_moe.FusedMoE3DWithLoRA)
    }
    assert expert_int8.install_expert_int8(patches) is None
    assert all(c.__dict__["create_lora_weights"] is not fn for c, fn in originals.items())
    patches.undo()
    assert all(c.__dict__["create_lora_weights"] is fn for c, fn in originals.items())


def test_install_refuses_a_changed_set_lora(monkeypatch):
    from vllm.lora.layers import fused_moe

    monkeypatch.setenv(expert_int8.ENV, "int8")
    monkeypatch.setattr(fused_moe.FusedMoE3DWithLoRA, "set_lora", lambda self, index, weights: None)
    patches = Patches()
    assert expert_int8.install_expert_int8(patches) == "FusedMoE3DWithLoRA.set_lora is not the pinned one"
    assert not patches.done


def _real_layer(cls, *, loras=2, experts=4, rank=8, hidden=32, inter=16, slices=2):
    """vLLM's own MoE LoRA class with just what its set_lora and reset_lora read (one tensor-parallel rank)."""
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.tp_size, layer.tp_rank, layer.fully_sharded, layer._w13_slices = 1, 0, False, slices
    layer.adapter_enabled = torch.zeros(loras + 1, dtype=torch.int)
    w13_n = 2 * inter // slices
    layer.w13_lora_a_stacked = tuple(torch.zeros(loras, experts, rank, hidden) for _ in range(slices))
    layer.w13_lora_b_stacked = tuple(torch.zeros(loras, experts, w13_n, rank) for _ in range(slices))
    layer.w2_lora_a_stacked = (torch.zeros(loras, experts, rank, inter),)
    layer.w2_lora_b_stacked = (torch.zeros(loras, experts, hidden, rank),)
    return layer


def test_vllms_own_set_lora_and_reset_lora_keep_the_copy_current(monkeypatch):
    # The installed vLLM's FusedMoEWithLoRA (Qwen3's two w13 slices): its set_lora resets the slot first, then
    # copies each factor in; the copy is rounded once per call, from what vLLM wrote.
    from vllm.lora.layers import fused_moe

    layer = _real_layer(fused_moe.FusedMoEWithLoRA)
    assert expert_int8.add_copies(layer) is None
    assert expert_int8.add_copies(layer) is None and len(expert_int8._copies) == 2  # made once a layer
    rounds = []
    vllms_round = expert_int8._Copy.requantize

    def counted(copy, index):
        rounds.append(index)
        vllms_round(copy, index)

    monkeypatch.setattr(expert_int8._Copy, "requantize", counted)
    g = torch.Generator().manual_seed(0)
    w1a, w3a, w2a = (torch.randn(4, 8, k, generator=g) for k in (32, 32, 16))
    w1b, w3b, w2b = (torch.randn(4, n, 8, generator=g) for n in (16, 16, 32))
    layer.set_lora(1, [w1a, w2a, w3a], [w1b, w2b, w3b])
    assert rounds == [1, 1]  # one per op (w13, w2), not again for the reset inside set_lora
    a, b, scale = expert_int8.int8_weights(layer.w13_lora_a_stacked, layer.w13_lora_b_stacked)
    assert scale is not None and a[1].dtype == torch.int8
    for s, (src_a, src_b) in enumerate(((w1a, w1b), (w3a, w3b))):
        qa, qb, sc = quantize_expert_lora(src_a, src_b)
        assert torch.equal(a[s][1], qa) and torch.equal(b[s][1], qb) and torch.equal(scale[s, 1], sc)
        assert not a[s][0].any() and not scale[s, 0].any()  # the other slot untouched
    layer.reset_lora(1)
    assert not scale.any() and not a[0].any() and not b[1].any()


def test_vllms_3d_layer_gpt_oss_keeps_the_copy_current():
    # GPT-OSS's fused experts: one w13 slice, vLLM's FusedMoE3DWithLoRA.set_lora takes [w13, w2] factors.
    from vllm.lora.layers import fused_moe

    layer = _real_layer(fused_moe.FusedMoE3DWithLoRA, slices=1)
    assert expert_int8.add_copies(layer) is None
    g = torch.Generator().manual_seed(1)
    w13a, w2a = torch.randn(4, 8, 32, generator=g), torch.randn(4, 8, 16, generator=g)
    w13b, w2b = torch.randn(4, 32, 8, generator=g), torch.randn(4, 32, 8, generator=g)
    layer.set_lora(0, [w13a, w2a], [w13b, w2b])
    a, b, scale = expert_int8.int8_weights(layer.w2_lora_a_stacked[:1], layer.w2_lora_b_stacked[:1])
    qa, qb, sc = quantize_expert_lora(w2a, w2b)
    assert torch.equal(a[0][0], qa) and torch.equal(b[0][0], qb) and torch.equal(scale[0, 0], sc)
