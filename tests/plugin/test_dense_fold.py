"""The plugin's folded dense LoRA (moelora.vllm_plugin.dense_fold): which layers are folded, that vLLM's own code
still reads and writes the same weights through the views, and the served output against the base GEMM plus vLLM's
torch LoRA ops, rows without an adapter and padded rows included (Triton's interpreter, small shapes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moelora.kernels.dense_config import MAX_SERVED_M
from moelora.vllm_plugin import dense_fold, dense_lora
from moelora.vllm_plugin.patches import Patches

from .test_dense_lora import MAPPING, _vllm_reference, _wrapper

WIDTHS = (64, 32, 32)  # q/k/v-like: column tiles of 32


def _linear(m: int, *, widths=WIDTHS, k: int = 48, rank: int = 8, loras: int = 3, bias: bool = True, seed: int = 0):
    """What dense_fold and apply_async read of one of vLLM's linear LoRA layers, with the inputs of one call."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    g = torch.Generator().manual_seed(seed)
    dtype = torch.float16
    base = SimpleNamespace(
        weight=torch.nn.Parameter((torch.randn(sum(widths), k, generator=g) / 4).to(dtype), requires_grad=False),
        bias=torch.nn.Parameter(torch.randn(sum(widths), generator=g).to(dtype), requires_grad=False) if bias else None,
        quant_method=UnquantizedLinearMethod(),
    )
    layer = SimpleNamespace(
        base_layer=base,
        tp_size=1,
        n_slices=len(widths),
        lora_a_stacked=tuple((torch.randn(loras, 1, rank, k, generator=g) / 4).to(dtype) for _ in widths),
        lora_b_stacked=tuple((torch.randn(loras, 1, n, rank, generator=g) / 4).to(dtype) for n in widths),
        output_slices=tuple(widths),
        device=torch.device("cpu"),
        _get_quant_method=lambda: base.quant_method,
        _events=[None, None],
        _lora_stream=None,
    )
    x = torch.randn(m, k, generator=g).to(dtype)
    return layer, x


@pytest.fixture
def folding(monkeypatch):
    """A window of 64 tokens; vLLM's LoRA-stream fork and kernels must not be reached where the fold serves."""

    def unreached(*args, **kwargs):
        raise AssertionError("the folded call reached vLLM's fork or kernels")

    monkeypatch.setattr(dense_fold, "_window", [64])
    monkeypatch.setattr(dense_fold, "_folded", {})
    monkeypatch.setitem(dense_lora._original, "fork", unreached)
    monkeypatch.setitem(dense_lora._original, "add_lora_linear", unreached)
    monkeypatch.setattr(dense_lora, "_layers", {})


def _want(layer, x, mapping, weight, bias, a) -> torch.Tensor:
    """The base GEMM plus vLLM's torch LoRA ops over the grouped (first) rows; padded rows get the base alone."""
    want = (x.double() @ weight.double().T) + (0.0 if bias is None else bias.double())
    rows = len(mapping)
    part = SimpleNamespace(x=x[:rows], a=a, b=layer.lora_b_stacked, widths=layer.output_slices)
    want[:rows] += _vllm_reference(part, mapping, 1.0).double()
    return want


@pytest.mark.parametrize("bias", [True, False])
def test_a_folded_layer_is_served_as_the_gemm_plus_vllms_lora(folding, bias: bool) -> None:
    padded = 5  # vLLM pads a batch to a captured graph's size and groups only the tokens it scheduled
    layer, x = _linear(len(MAPPING) + padded, bias=bias, seed=int(bias))
    weight, b, a = (
        layer.base_layer.weight.clone(),
        layer.base_layer.bias,
        tuple(t.clone() for t in layer.lora_a_stacked),
    )
    layer.punica_wrapper = _wrapper(MAPPING)
    assert dense_fold.fold_layer(layer, groups=4) is None
    fold = dense_fold._folded[id(layer)]
    # One weight: the base rows, then every slice's lora_a; the base layer's weight and bias and vLLM's lora_a views.
    assert layer.base_layer.weight.data_ptr() == fold.weight.data_ptr() and fold.weight.shape == (128 + 3 * 24, 48)
    assert all(t.data_ptr() == fold.weight[128 + 24 * i :].data_ptr() for i, t in enumerate(layer.lora_a_stacked))
    assert torch.equal(layer.base_layer.weight, weight) and all(map(torch.equal, layer.lora_a_stacked, a))
    assert (fold.bias is None) is (not bias) and (not bias or torch.equal(fold.bias[128:], torch.zeros(72).half()))
    out = dense_lora.apply_async(layer, x, layer.base_layer.bias)
    want = _want(layer, x, MAPPING, weight, None if b is None else b.detach().clone(), a)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    no_adapter = torch.tensor(MAPPING + [-1] * padded) < 0  # the base output, bit for bit the GEMM's columns
    base = torch.nn.functional.linear(x, fold.weight, fold.bias)[:, :128]
    assert torch.equal(out[no_adapter], base[no_adapter])


def test_vllms_own_set_lora_and_reset_lora_write_through_the_views(folding) -> None:
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    layer, x = _linear(len(MAPPING), widths=(64,), seed=2)
    layer.punica_wrapper = _wrapper(MAPPING)
    layer.reset_lora = lambda index: BaseLinearLayerWithLoRA.reset_lora(layer, index)
    assert dense_fold.fold_layer(layer, groups=4) is None
    fold = dense_fold._folded[id(layer)]
    new_a, new_b = torch.randn(8, 48).half() / 4, torch.randn(64, 8).half() / 4
    BaseLinearLayerWithLoRA.set_lora(layer, 2, new_a, new_b)  # vLLM's code, as an adapter's load runs it
    assert torch.equal(fold.weight[64 + 2 * 8 : 64 + 3 * 8], new_a)
    out = dense_lora.apply_async(layer, x, layer.base_layer.bias)
    want = _want(layer, x, MAPPING, layer.base_layer.weight, layer.base_layer.bias, layer.lora_a_stacked)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    BaseLinearLayerWithLoRA.reset_lora(layer, 2)  # an adapter evicted from slot 2
    assert not fold.weight[64 + 2 * 8 : 64 + 3 * 8].any() and fold.weight[64 : 64 + 2 * 8].any()


def test_calls_the_fold_does_not_serve_go_the_callers_way(folding) -> None:
    layer, x = _linear(len(MAPPING))
    layer.punica_wrapper = _wrapper(MAPPING)
    assert dense_fold.serve(layer, x, None) is None  # not folded
    assert dense_fold.fold_layer(layer, groups=4) is None
    assert dense_fold.serve(layer, x, torch.zeros(128).half()) is None  # a bias that is not the layer's own
    assert dense_fold.serve(layer, torch.randn(65, 48).half(), None) is None  # above the window
    layer.punica_wrapper = _wrapper([-1] * len(MAPPING))
    assert dense_fold.serve(layer, x, None) is None  # no adapter in the batch
    layer.punica_wrapper = _wrapper(MAPPING)
    assert dense_fold.serve(layer, x.float(), None) is None  # another dtype
    assert dense_fold.serve(layer, x, None) is not None  # and the call that is served, for contrast


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda layer: setattr(layer, "tp_size", 2), "tensor parallel"),
        (lambda layer: setattr(layer.base_layer, "quant_method", object()), "quantized base"),
        (lambda layer: setattr(layer, "output_slices", (64, 32)), "slices"),
        (lambda layer: layer.__dict__.update(vars(_linear(4, widths=(64, 40, 24))[0])), "slice widths"),
        (lambda layer: setattr(layer.base_layer, "weight", torch.nn.Parameter(torch.randn(128, 48))), "dtype"),
        (
            lambda layer: setattr(layer, "lora_a_stacked", tuple(t[:, :, :, :40] for t in layer.lora_a_stacked)),
            "lora_a",
        ),
    ],
)
def test_layers_that_do_not_qualify_are_left_as_they_are(folding, change, why) -> None:
    layer, _ = _linear(4)
    change(layer)
    before = (layer.base_layer.weight.data_ptr(), tuple(t.data_ptr() for t in layer.lora_a_stacked))
    assert why in dense_fold.fold_layer(layer, groups=4)
    assert before == (layer.base_layer.weight.data_ptr(), tuple(t.data_ptr() for t in layer.lora_a_stacked))
    assert not dense_fold._folded


def test_slice_widths_pick_the_column_tile() -> None:
    assert dense_fold._block_n((4096, 512, 512)) == 64
    assert dense_fold._block_n((2880,)) == 32  # one slice: 32, the faster measured
    assert dense_fold._block_n((64, 32, 32)) == 32
    assert dense_fold._block_n((48,)) == 16
    assert dense_fold._block_n((40,)) is None


def test_the_managers_linear_layers_are_folded_and_counted(folding, plugin_log) -> None:
    from vllm.lora.layers.row_parallel_linear import RowParallelLinearWithLoRA

    def vllm_layer(seed: int, stream: bool = True) -> RowParallelLinearWithLoRA:
        layer = RowParallelLinearWithLoRA.__new__(RowParallelLinearWithLoRA)  # vLLM's class, its config not needed
        torch.nn.Module.__init__(layer)
        for name, value in vars(_linear(2, widths=(64,), seed=seed)[0]).items():
            object.__setattr__(layer, name, value)
        object.__setattr__(layer, "punica_wrapper", _wrapper([0, 1]))
        object.__setattr__(layer, "_enable_aux_cuda_stream", stream)
        return layer

    quantized = vllm_layer(1)
    quantized.base_layer.quant_method = object()
    modules = {"a": vllm_layer(0), "b": quantized, "c": vllm_layer(2, stream=False), "d": SimpleNamespace()}
    dense_fold.fold_modules(SimpleNamespace(modules=modules))
    assert set(dense_fold._folded) == {id(modules["a"])}  # no LoRA stream: not served by apply_async, not folded
    assert any("64 tokens: 1 layers; kept: {'quantized base': 1}" in line for line in plugin_log)


def test_install_reads_the_window_and_comes_off(monkeypatch) -> None:
    from vllm.lora.model_manager import LoRAModelManager

    before = LoRAModelManager._create_lora_modules
    patches = Patches()
    for raw, why in (("0", "=0"), ("abc", "token count"), ("-1", "token count")):
        monkeypatch.setenv(dense_fold.ENV, raw)
        assert why in dense_fold.install_dense_fold(patches, apply_async_installed=True)
    monkeypatch.delenv(dense_fold.ENV)
    assert dense_fold.install_dense_fold(patches, apply_async_installed=True) is None  # on by default
    assert dense_fold.window() == MAX_SERVED_M == 64  # dense_lora's one-launch window
    patches.undo()
    monkeypatch.setenv(dense_fold.ENV, "48")
    assert "not installed" in dense_fold.install_dense_fold(patches, apply_async_installed=False)
    assert not patches.done
    assert dense_fold.install_dense_fold(patches, apply_async_installed=True) is None
    try:
        assert LoRAModelManager._create_lora_modules is dense_fold.create_lora_modules and dense_fold.window() == 48
    finally:
        patches.undo()
    assert LoRAModelManager._create_lora_modules is before and dense_fold.window() == 0
