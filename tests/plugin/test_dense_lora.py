"""The plugin's dense LoRA route (moelora.vllm_plugin.dense_lora): which add_lora_linear calls go to dense_splitk and
which stay vLLM's, the result on both of vLLM's paths against vLLM's own torch LoRA ops (Triton's interpreter, small
shapes), and the hook's pinned contract."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moelora.kernels import dense_config as dense
from moelora.kernels import dense_splitk as splitk
from moelora.vllm_plugin import dense_lora, lora_stream
from moelora.vllm_plugin.patches import Patches

# 18 rows: rows without an adapter, three adapters, slot 2 over two row blocks of 16.
MAPPING = [2, -1, 0, 2, 2, -1, 1, 0] + [2] * 10
WIDTHS = (40, 16, 24)  # q/k/v-like: three slices of different widths


def _wrapper(mapping: list[int], *, loras: int = 3, specialize: bool = False) -> SimpleNamespace:
    """What the route reads of vLLM's PunicaWrapperGPU: its token-mapping metadata, vLLM's own class."""
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    meta = LoRAKernelMeta.make(loras, 128, device="cpu")
    meta.prepare_tensors(torch.tensor(mapping, dtype=torch.int32))
    return SimpleNamespace(token_mapping_meta=meta, lora_config=SimpleNamespace(specialize_active_lora=specialize))


def _layer(m: int, *, k: int = 48, rank: int = 8, widths=WIDTHS, loras: int = 3, dtype=torch.float16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        x=torch.randn(m, k, generator=g).to(dtype),
        a=tuple((torch.randn(loras, 1, rank, k, generator=g) / 4).to(dtype) for _ in widths),
        b=tuple((torch.randn(loras, 1, n, rank, generator=g) / 4).to(dtype) for n in widths),
        base=torch.randn(m, sum(widths), generator=g).to(dtype),
        widths=tuple(widths),
    )


def _vllm_reference(layer, mapping: list[int], scale: float) -> torch.Tensor:
    """vLLM's torch LoRA ops (its CPU punica path): a float32 shrink per slice, then the expand into the slice."""
    from vllm.lora.ops.torch_ops import bgmv_expand_slice, bgmv_shrink

    ids = torch.tensor(mapping)
    rows = ids >= 0
    out = torch.zeros(len(mapping), sum(layer.widths), dtype=layer.x.dtype)
    part = out[rows]
    offset = 0
    for a, b, n in zip(layer.a, layer.b, layer.widths, strict=True):
        buffer = torch.zeros(int(rows.sum()), a.shape[-2], dtype=torch.float32)
        bgmv_shrink(layer.x[rows], a, buffer, ids[rows], scale)
        bgmv_expand_slice(buffer, b, part, ids[rows], offset, n, add_inputs=True)
        offset += n
    out[rows] = part
    return out


@pytest.fixture
def vllm_calls(monkeypatch):
    """vLLM's own add_lora_linear replaced by a recorder: a call that reaches it was not routed."""
    calls: list[dict] = []

    def original(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, *, buffer=None, **kwargs):
        calls.append({"m": x.size(0), "buffer": buffer, **kwargs})

    from vllm.utils.multi_stream_utils import maybe_execute_in_parallel

    monkeypatch.setitem(dense_lora._original, "add_lora_linear", original)
    monkeypatch.setitem(dense_lora._original, "fork", maybe_execute_in_parallel)  # as the install keeps it
    monkeypatch.setattr(dense_lora, "_layers", {})
    return calls


def _call(wrapper, y, layer, **kwargs) -> None:
    dense_lora.add_lora_linear(wrapper, y, layer.x, layer.a, layer.b, 0.5, layer.widths, **kwargs)


def test_served_window_and_configs() -> None:
    assert dense.served_config(1, 3) is None  # M = 1: vLLM's launches are faster there
    assert dense.served_config(2, 3) == dense.served_config(16, 3) == dense.SplitKConfig(8, 64, 16)
    assert dense.served_config(17, 3) == dense.served_config(64, 3) == dense.SplitKConfig(8, 64, 8)
    assert dense.served_config(16, 1) == dense.SplitKConfig(16, 128, 16)
    assert dense.served_config(64, 1) == dense.SplitKConfig(32, 64, 16)
    assert dense.served_config(dense.MAX_SERVED_M + 1, 1) is None  # not measured: vLLM's
    for slices in (1, 3):
        picked = {dense.served_config(m, slices) for m in range(2, dense.MAX_SERVED_M + 1)}
        assert picked == set(dense.served_configs(slices))


def test_a_served_table_replaces_its_kinds_and_refuses_what_cannot_launch() -> None:
    table = dense.parse_served("several=16:4/128/4, 48:8/64/8/2")
    assert table["several"] == ((16, dense.SplitKConfig(4, 128, 4)), (48, dense.SplitKConfig(8, 64, 8, num_warps=2)))
    assert table["one"] == dense.SERVED["one"]
    assert dense.served_config(20, 3, table) == dense.SplitKConfig(8, 64, 8, num_warps=2)
    assert dense.served_config(49, 3, table) is None  # past the table's largest M: vLLM's
    assert dense.served_configs(3, table) == tuple(c for _, c in table["several"])
    for text, why in (
        ("all=16:4/64/4", "'several' or 'one'"),
        ("one=16:4/96/4", "power of two"),
        ("one=16:4/64/4/3", "num_warps"),
        ("one=16:4/64", "each at least 1"),
        ("one=16:0/64/4", "each at least 1"),
        ("one=16:four/64/4", "whole numbers"),
        ("one=32:4/64/4,16:4/64/4", "rise"),
        (f"one={dense.MAX_SERVED_M + 1}:4/64/4", "rise"),
        ("one=1:4/64/4", "rise"),
    ):
        with pytest.raises(ValueError, match=why):
            dense.parse_served(text)


def test_the_route_launches_the_served_tables_config(vllm_calls, monkeypatch) -> None:
    monkeypatch.setattr(dense_lora, "_served", dense.parse_served("several=64:4/16/2"))
    launched: list[tuple] = []
    real = splitk.dense_splitk

    def recording(*args, **kwargs):
        launched.append((kwargs["split_k"], kwargs["block_k"], kwargs["n_chunks"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(splitk, "dense_splitk", recording)
    layer = _layer(18, seed=18)
    y = layer.base.clone()
    _call(_wrapper(MAPPING), y, layer)
    assert launched == [(4, 16, 2)] and not vllm_calls
    want = _vllm_reference(layer, MAPPING, 0.5).double() + layer.base.double()
    torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("valid", [True, False])
def test_the_served_table_is_read_at_install(monkeypatch, caplog, valid) -> None:
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    monkeypatch.delenv(dense_lora.ENV, raising=False)
    monkeypatch.setenv(dense_lora.CONFIGS_ENV, "one=64:8/128/8" if valid else "one=64:8/100/8")
    patches = Patches()
    assert dense_lora.install_dense_lora(PunicaWrapperGPU, patches) is None
    try:
        want = ((64, dense.SplitKConfig(8, 128, 8)),) if valid else dense.SERVED["one"]
        assert dense_lora._served["one"] == want and dense_lora._served["several"] == dense.SERVED["several"]
        assert valid or "MOELORA_DENSE_SPLITK_CONFIGS ignored" in caplog.text
    finally:
        patches.undo()
    assert not dense_lora._served


def test_grid_arithmetic_matches_the_launch() -> None:
    config = dense.SplitKConfig(8, 64, 16)
    # K 2880 in 45 tiles of 64: 8 splits; 9 groups of one row block each at M = 16, 3 slices: 27 units.
    assert dense.splitk_programs(m=16, groups=9, slices=3, k=2880, config=config) == ((8 + 16) * 27, 27)
    # M = 64, 9 groups: at most 9 + 4 row blocks, not 9 x 4.
    assert dense.splitk_programs(m=64, groups=9, slices=3, k=2880, config=config)[1] == 3 * 13


@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize("m", [2, 18])
def test_routed_calls_match_vllms_reference_on_both_paths(add: bool, m: int, vllm_calls) -> None:
    mapping = MAPPING[:m]
    layer = _layer(m, seed=m)
    wrapper = _wrapper(mapping)
    # One stream adds into the layer's output; the LoRA stream writes an output of its own (add_inputs=False), which
    # vLLM zeroes first: NaN here shows every element is written, rows without an adapter as zeros.
    y = layer.base.clone() if add else torch.full_like(layer.base, float("nan"))
    _call(wrapper, y, layer, **({} if add else {"add_inputs": False}))
    assert not vllm_calls
    want = _vllm_reference(layer, mapping, 0.5).double() + (layer.base.double() if add else 0.0)
    torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)
    bare = torch.tensor(mapping) < 0
    assert torch.equal(y[bare], layer.base[bare] if add else torch.zeros_like(layer.base[bare]))


def test_calls_outside_the_rule_stay_vllms(vllm_calls) -> None:
    layer = _layer(18)
    wrapper = _wrapper(MAPPING)
    y = layer.base.clone()
    one = _layer(1)
    _call(_wrapper([1]), one.base.clone(), one)  # M = 1
    big = _layer(dense.MAX_SERVED_M + 1)
    _call(_wrapper([0] * (dense.MAX_SERVED_M + 1)), big.base.clone(), big)  # above the window
    _call(_wrapper([-1] * 18), y, layer)  # no adapter in the batch
    _call(wrapper, y, layer, buffer=torch.empty(3, 18, 8))  # a caller's buffer
    _call(wrapper, y, layer, add_inputs=True, offset_start=4)  # a keyword it does not know
    wide = _layer(18, dtype=torch.float32)  # not fp16/bf16
    _call(wrapper, wide.base.clone(), wide)
    with pytest.MonkeyPatch.context() as patch:  # traced by torch.compile: the route's host-side checks cannot be
        patch.setattr(torch.compiler, "is_compiling", lambda: True)
        _call(wrapper, y, layer)
    assert [c["m"] for c in vllm_calls] == [1, dense.MAX_SERVED_M + 1, 18, 18, 18, 18, 18]
    assert torch.equal(y, layer.base)


def test_a_grid_that_does_not_fit_stays_vllms(vllm_calls, monkeypatch) -> None:
    layer = _layer(18)
    wrapper = _wrapper(MAPPING)
    monkeypatch.setattr(splitk, "splitk_prepare", lambda *a, **k: 100)  # the GPU holds 100 programs
    y = layer.base.clone()
    _call(wrapper, y, layer)  # (1 + 8) x 3 slices x 5 row blocks = 135 programs
    assert len(vllm_calls) == 1 and torch.equal(y, layer.base)

    def refuses(*args, **kwargs):
        raise ValueError("dense_splitk: does not fit")

    monkeypatch.setattr(splitk, "splitk_prepare", lambda *a, **k: 10**6)
    monkeypatch.setattr(dense_lora, "_layers", {})
    monkeypatch.setattr(splitk, "dense_splitk", refuses)
    _call(wrapper, y, layer)
    assert len(vllm_calls) == 2 and torch.equal(y, layer.base)


def test_each_layer_is_prepared_once_per_epilogue_and_never_in_capture(vllm_calls, monkeypatch) -> None:
    prepared: list[tuple] = []
    real = splitk.splitk_prepare

    def counting(y, x, layout, meta, *, add, config):
        prepared.append((x.shape[0], meta[4], add, config))
        return real(y, x, layout, meta, add=add, config=config)

    monkeypatch.setattr(splitk, "splitk_prepare", counting)
    layer = _layer(18)
    wrapper = _wrapper(MAPPING)
    monkeypatch.setattr(dense_lora, "_capturing", lambda device: True)
    _call(wrapper, layer.base.clone(), layer)  # first met inside capture: vLLM's, nothing made
    assert len(vllm_calls) == 1 and not prepared and not dense_lora._layers
    monkeypatch.setattr(dense_lora, "_capturing", lambda device: False)
    big = SimpleNamespace(**{**vars(layer), "x": torch.randn(100, 48).half(), "base": torch.randn(100, 80).half()})
    _call(_wrapper([0] * 100), big.base.clone(), big)  # an eager batch outside the window prepares the layer
    assert len(vllm_calls) == 2
    # Every config at the largest M and group count (max_loras + 1), for this epilogue.
    assert prepared == [(dense.MAX_SERVED_M, 4, True, c) for c in dense.served_configs(3)]
    monkeypatch.setattr(dense_lora, "_capturing", lambda device: True)
    _call(wrapper, layer.base.clone(), layer)  # in capture now: served, nothing more prepared
    _call(wrapper, torch.zeros_like(layer.base), layer, add_inputs=False)  # the other epilogue was never prepared
    assert len(vllm_calls) == 3 and len(prepared) == 2


@pytest.mark.parametrize("bound, prepares", [(80, False), (40, True)])
def test_a_call_above_the_bound_prepares_only_where_the_window_reaches_past_it(
    bound, prepares, vllm_calls, monkeypatch, fresh_bound
) -> None:
    """Above lora_stream's bound a layer's LoRA is added in place (vLLM's add_inputs=True): with the whole window
    at or below the bound that epilogue is never served, so a call there prepares nothing; with part of the window
    above the bound it prepares as any eager call outside the window does."""
    prepared: list[bool] = []
    monkeypatch.setattr(splitk, "splitk_prepare", lambda *args, add, config: prepared.append(add) or 10**6)
    monkeypatch.setenv(lora_stream.ENV, str(bound))
    big = _layer(100)
    _call(_wrapper([0] * 100), big.base.clone(), big)  # add_inputs defaults to True, as in vLLM's path in place
    assert len(vllm_calls) == 1  # outside the window: vLLM's either way
    assert bool(prepared) is prepares and set(prepared) <= {True}


def test_hook_installs_on_vllms_punica_wrapper_and_comes_off() -> None:
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    before, fork = PunicaWrapperGPU.add_lora_linear, BaseLinearLayerWithLoRA._apply_async_impl
    patches = Patches()
    assert dense_lora.install_dense_lora(PunicaWrapperGPU, patches) is None  # the installed vLLM has the pinned one
    try:
        assert PunicaWrapperGPU.add_lora_linear is dense_lora.add_lora_linear
        assert BaseLinearLayerWithLoRA._apply_async_impl is dense_lora.apply_async
        from vllm.utils.multi_stream_utils import maybe_execute_in_parallel

        assert dense_lora._original == {
            "add_lora_linear": before,
            "apply_async": fork,
            "fork": maybe_execute_in_parallel,
            "apply_sync": BaseLinearLayerWithLoRA._apply_sync,
        }
    finally:
        patches.undo()
    assert PunicaWrapperGPU.add_lora_linear is before and BaseLinearLayerWithLoRA._apply_async_impl is fork
    assert not dense_lora._original


def test_a_changed_lora_stream_fork_is_kept_with_its_fill(monkeypatch, plugin_log) -> None:
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    def changed(self, x, bias=None, stream=None):
        return "kept"

    monkeypatch.setattr(BaseLinearLayerWithLoRA, "_apply_async_impl", changed)
    patches = Patches()
    assert dense_lora.install_dense_lora(PunicaWrapperGPU, patches) is None  # the route itself still installs
    try:
        assert BaseLinearLayerWithLoRA._apply_async_impl is changed
        assert PunicaWrapperGPU.add_lora_linear is dense_lora.add_lora_linear
    finally:
        patches.undo()
    assert any("output fill stays" in line for line in plugin_log)


class _Base:
    """The base layer's quant method: returns the layer's base output (a copy, as a GEMM writes a new tensor), plus
    the bias when one is passed."""

    def __init__(self, out: torch.Tensor) -> None:
        self.out = out

    def apply(self, base_layer, x, bias):
        return self.out.clone() if bias is None else self.out + bias


def _linear(layer, wrapper) -> SimpleNamespace:
    """What apply_async reads of vLLM's linear LoRA layer; no LoRA stream (vLLM's fork then runs both in turn)."""
    return SimpleNamespace(
        punica_wrapper=wrapper,
        lora_a_stacked=layer.a,
        lora_b_stacked=layer.b,
        output_slices=layer.widths,
        device=layer.x.device,
        base_layer=None,
        _get_quant_method=lambda: _Base(layer.base),
        _events=[None, None],
        _lora_stream=None,
    )


def _garbage_in_half_buffers(monkeypatch) -> None:
    """torch.empty hands out NaN where it makes an fp16 buffer (the LoRA stream's output; the kernels' own scratch is
    int32 and float32)."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.dtype == torch.float16 else out

    monkeypatch.setattr(torch, "empty", empty)


def test_the_lora_stream_output_is_not_filled_where_the_route_writes_every_row(vllm_calls, monkeypatch) -> None:
    fills: list[torch.Size] = []
    real_zero, real_zeros = torch.Tensor.zero_, torch.zeros
    monkeypatch.setattr(torch.Tensor, "zero_", lambda t: fills.append(t.shape) or real_zero(t))
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: fills.append(a) or real_zeros(*a, **k))
    _garbage_in_half_buffers(monkeypatch)  # were any row of the unfilled output left unwritten, the sum shows it
    layer = _layer(18, seed=3)
    linear = _linear(layer, _wrapper(MAPPING))
    dense_lora.apply_async(linear, layer.x)  # the first call prepares the layer (its scratch is zeroed)
    fills.clear()
    out = dense_lora.apply_async(linear, layer.x)
    assert not vllm_calls and fills == []
    want = layer.base.double() + _vllm_reference(layer, MAPPING, 1.0).double()
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def test_rows_past_the_grouped_tokens_come_back_zero_with_the_bias_added(vllm_calls, monkeypatch) -> None:
    """vLLM pads a batch to a captured graph's size and groups only the tokens it scheduled (13 of 16 here): the
    padded rows of the unfilled output must not carry garbage into the layer's output."""
    _garbage_in_half_buffers(monkeypatch)
    real, rows = 13, 16
    layer = _layer(real, seed=13)
    layer.x = torch.cat([layer.x, torch.randn(rows - real, layer.x.shape[1]).half()])
    layer.base = torch.cat([layer.base, torch.randn(rows - real, layer.base.shape[1]).half()])
    bias = torch.randn(sum(layer.widths)).half()
    out = dense_lora.apply_async(_linear(layer, _wrapper(MAPPING[:real])), layer.x, bias)
    assert not vllm_calls
    want = (layer.base + bias).double()
    grouped = SimpleNamespace(**{**vars(layer), "x": layer.x[:real]})
    want[:real] += _vllm_reference(grouped, MAPPING[:real], 1.0).double()
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def test_graphs_per_adapter_count_keep_vllms_filled_fork(monkeypatch) -> None:
    monkeypatch.setitem(dense_lora._original, "apply_async", lambda self, x, bias=None: "vllm's")
    layer = _layer(18)
    assert dense_lora.apply_async(_linear(layer, _wrapper(MAPPING, specialize=True)), layer.x) == "vllm's"


def test_a_call_the_route_declines_gets_vllms_filled_output(vllm_calls, monkeypatch) -> None:
    _garbage_in_half_buffers(monkeypatch)
    for m, mapping in ((1, [0]), (18, [-1] * 18)):  # M = 1 (vLLM's kernels), no adapter in the batch
        layer = _layer(m, seed=m)
        out = dense_lora.apply_async(_linear(layer, _wrapper(mapping)), layer.x)
        assert torch.equal(out, layer.base)  # filled with zeros; vLLM's kernels (the recorder) added nothing
    assert [(c["m"], c["add_inputs"]) for c in vllm_calls] == [(1, False), (18, False)]


def test_a_3d_input_stays_with_vllms_fork(monkeypatch) -> None:
    monkeypatch.setitem(dense_lora._original, "apply_async", lambda self, x, bias=None: ("vllm's", x.shape))
    assert dense_lora.apply_async(SimpleNamespace(), torch.zeros(1, 4, 8)) == ("vllm's", (1, 4, 8))


def test_hook_refuses_a_changed_signature_and_the_switch(monkeypatch) -> None:
    class Changed:
        def add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices):  # no buffer, kwargs
            return "kept"

    patches = Patches()
    assert "signature differs" in dense_lora.install_dense_lora(Changed, patches)
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    monkeypatch.setenv(dense_lora.ENV, "0")
    assert dense_lora.install_dense_lora(PunicaWrapperGPU, patches) == f"{dense_lora.ENV}=0"
    assert not patches.done


def test_fewer_groups_than_slots_when_vllm_specialises_on_active_adapters(vllm_calls) -> None:
    """With `specialize_active_lora` the group count is the batch's (2 here), below the id table's 4 slots: the
    same compiled variant (its group padding follows the table) serves it."""
    mapping = [1, -1, 1, 1, -1]
    layer = _layer(5, seed=5)
    wrapper = _wrapper(mapping, specialize=True)
    assert int(wrapper.token_mapping_meta.meta_args(5, True)[6].item()) == 2
    y = layer.base.clone()
    _call(wrapper, y, layer)
    assert not vllm_calls
    want = _vllm_reference(layer, mapping, 0.5).double() + layer.base.double()
    torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("variable", [lora_stream.ENV, lora_stream.DENSE_ENV])
def test_above_the_bound_the_lora_is_added_on_the_current_stream_without_a_fork(
    vllm_calls, monkeypatch, fresh_bound, variable
) -> None:
    """A step of more tokens than lora_stream's bound runs vLLM's own path without the second stream: the base output,
    then the LoRA added into it (routed here, so dense_splitk adding); no fork, no LoRA-only output. At the bound
    itself the fork runs. The dense layers' own bound moves theirs and leaves the MoE layers' where it was."""
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    forks: list[int] = []
    fork = dense_lora._original["fork"]
    monkeypatch.setitem(dense_lora._original, "fork", lambda *args: forks.append(1) or fork(*args))
    monkeypatch.setitem(dense_lora._original, "apply_sync", BaseLinearLayerWithLoRA._apply_sync)  # as installed
    monkeypatch.delenv(lora_stream.ENV, raising=False)
    monkeypatch.setenv(variable, "18")
    assert lora_stream.in_place(19) == (variable == lora_stream.ENV)
    layer, mapping = _layer(19, seed=19), [0, 2, -1, 1] * 4 + [1, 0, 2]
    linear = _linear(layer, _wrapper(mapping))
    linear.punica_wrapper.add_lora_linear = lambda *args, **kwargs: dense_lora.add_lora_linear(
        linear.punica_wrapper, *args, **kwargs
    )
    linear._apply_sync = lambda x, bias=None: BaseLinearLayerWithLoRA._apply_sync(linear, x, bias)
    linear._apply_lora_to_output = lambda x, out: BaseLinearLayerWithLoRA._apply_lora_to_output(linear, x, out)
    out = dense_lora.apply_async(linear, layer.x)
    assert forks == [] and not vllm_calls  # routed, adding into the base output
    want = layer.base.double() + _vllm_reference(layer, mapping, 1.0).double()
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    at_bound = _layer(18, seed=18)
    dense_lora.apply_async(_linear(at_bound, _wrapper(MAPPING)), at_bound.x)
    assert forks == [1]
