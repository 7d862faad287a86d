"""dense_stream: with MOELORA_DENSE_LORA_STREAM=main, vLLM's dense dual-stream LoRA entry point computes the
single-stream result on the current stream; otherwise, or on a vLLM that differs, nothing is patched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from vllm import envs
from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
from vllm.model_executor.layers.linear import UnquantizedLinearMethod

from moelora.vllm_plugin import dense_stream
from moelora.vllm_plugin.patches import Patches


class AddingPunica:
    """vLLM's punica contract for one slice: y += x @ A^T @ B^T when add_inputs (its default), else y = that."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def add_lora_linear(self, y, x, lora_a, lora_b, scale, output_slices, *, add_inputs=True, **_):
        self.calls.append(add_inputs)
        delta = x @ lora_a[0][0, 0].T @ lora_b[0][0, 0].T * scale
        if add_inputs:
            y += delta
        else:
            y.copy_(delta)
        return y


def layer(seed: int = 0) -> BaseLinearLayerWithLoRA:
    """vLLM's dense LoRA layer around a 6 -> 5 projection with one rank-2 adapter, without its CUDA-only set-up."""
    g = torch.Generator().manual_seed(seed)
    lay = object.__new__(BaseLinearLayerWithLoRA)
    torch.nn.Module.__init__(lay)
    # cpu_linear: what vLLM's CPU platform binds when it loads weights, which this layer never did.
    lay.base_layer = SimpleNamespace(weight=torch.randn(5, 6, generator=g), bias=None, cpu_linear=F.linear)
    lay.base_layer.quant_method = UnquantizedLinearMethod()
    lay.lora_a_stacked = (torch.randn(1, 1, 2, 6, generator=g),)
    lay.lora_b_stacked = (torch.randn(1, 1, 5, 2, generator=g),)
    lay.output_slices = (5,)
    lay.punica_wrapper = AddingPunica()
    return lay


@pytest.fixture
def asked(monkeypatch):
    monkeypatch.setenv(dense_stream.ENV, "main")
    monkeypatch.setattr(envs, "VLLM_LORA_ENABLE_DUAL_STREAM", True, raising=False)


def test_the_dual_stream_entry_adds_the_lora_into_the_base_output_on_the_current_stream(asked):
    original = BaseLinearLayerWithLoRA._apply_async_impl
    patches = Patches()
    assert dense_stream.install_dense_stream(patches) is None  # the installed vLLM has the pinned methods
    try:
        lay, x = layer(), torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
        out = lay._apply_async_impl(x, None)
        a, b = lay.lora_a_stacked[0][0, 0], lay.lora_b_stacked[0][0, 0]
        torch.testing.assert_close(out, x @ lay.base_layer.weight.T + x @ a.T @ b.T)
        assert lay.punica_wrapper.calls == [True]  # expand added into the base output: no buffer, no join
        x3 = x.unsqueeze(0)  # the transformers backend's (1, tokens, hidden) comes back in its shape
        assert lay._apply_async_impl(x3, None).shape == (1, 3, 5)
    finally:
        patches.undo()
    assert BaseLinearLayerWithLoRA._apply_async_impl is original


def test_nothing_changes_unless_asked_or_when_vllm_has_no_dual_stream(monkeypatch):
    patches = Patches()
    monkeypatch.delenv(dense_stream.ENV, raising=False)
    assert "not asked" in dense_stream.install_dense_stream(patches)
    monkeypatch.setenv(dense_stream.ENV, "main")
    monkeypatch.setattr(envs, "VLLM_LORA_ENABLE_DUAL_STREAM", False, raising=False)
    assert "already runs on the main stream" in dense_stream.install_dense_stream(patches)
    assert not patches.done


def test_a_changed_layer_class_is_refused(asked):
    class Changed:
        def _apply_async_impl(self, x, bias=None, stream=None):  # not vLLM's
            return "kept"

        def _apply_sync(self, x, bias=None):
            return "sync"

    patches = Patches()
    assert "signature differs" in dense_stream.install_dense_stream(patches, Changed)
    assert not patches.done and Changed()._apply_async_impl(1) == "kept"
