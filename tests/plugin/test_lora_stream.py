"""lora_stream: which calls of vLLM's MoE experts run their LoRA on the second stream. Above the bound the call sees
its LoRA context without a stream (vLLM's in-place path) and the context gets it back afterwards, whatever happens;
at or below it, and without a stream, the call is vLLM's as it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moelora.vllm_plugin import lora_stream
from moelora.vllm_plugin.patches import Patches


@pytest.fixture
def seen(monkeypatch, fresh_bound):
    """vLLM's TritonExperts.apply replaced by a recorder of the stream its context showed during the call."""
    calls: list[object] = []

    def original(self, output, hidden_states, *args, **kwargs):
        context = self._lora_context
        calls.append((context and context.aux_stream, context and context.events, args, kwargs))
        if kwargs.get("fail"):
            raise RuntimeError("inside vLLM")
        return "applied"

    monkeypatch.setitem(lora_stream._original, "apply", original)
    monkeypatch.delenv(lora_stream.ENV, raising=False)
    return calls


def _experts(stream: object = "stream") -> SimpleNamespace:
    return SimpleNamespace(_lora_context=SimpleNamespace(aux_stream=stream, events=("e0", "e1")))


def test_calls_above_the_bound_see_no_stream_and_the_context_gets_it_back(seen) -> None:
    experts = _experts()
    bound = lora_stream.MAX_TOKENS
    for tokens in (1, 16, bound):
        assert lora_stream.experts_apply(experts, None, torch.empty(tokens, 4), 7, key="v") == "applied"
    assert lora_stream.experts_apply(experts, None, torch.empty(bound + 1, 4), 7, key="v") == "applied"
    # vLLM's modular kernel passes everything by keyword.
    big = torch.empty(bound + 1, 4)
    assert lora_stream.experts_apply(experts, output=None, hidden_states=big, key="v") == "applied"
    assert [call[:2] for call in seen] == [("stream", ("e0", "e1"))] * 3 + [(None, None)] * 2
    assert [call[2:] for call in seen] == [((7,), {"key": "v"})] * 4 + [((), {"key": "v"})]  # passed on as given
    assert (experts._lora_context.aux_stream, experts._lora_context.events) == ("stream", ("e0", "e1"))


def test_the_stream_comes_back_when_vllms_call_raises(seen) -> None:
    experts = _experts()
    with pytest.raises(RuntimeError, match="inside vLLM"):
        lora_stream.experts_apply(experts, None, torch.empty(lora_stream.MAX_TOKENS + 1, 4), fail=True)
    assert seen[0][:2] == (None, None)
    assert (experts._lora_context.aux_stream, experts._lora_context.events) == ("stream", ("e0", "e1"))


def test_no_context_or_no_stream_is_vllms_call_as_it_was(seen) -> None:
    assert lora_stream.experts_apply(_experts(None), None, torch.empty(5000, 4)) == "applied"
    assert lora_stream.experts_apply(SimpleNamespace(_lora_context=None), None, torch.empty(5000, 4)) == "applied"
    assert [call[:2] for call in seen] == [(None, ("e0", "e1")), (None, None)]


@pytest.mark.parametrize(("value", "bound"), [("64", 64), ("0", 0), ("-3", 0), ("many", lora_stream.MAX_TOKENS)])
def test_the_bound_comes_from_the_variable_read_once(monkeypatch, fresh_bound, value, bound) -> None:
    monkeypatch.setenv(lora_stream.ENV, value)
    assert lora_stream.max_tokens() == bound
    monkeypatch.setenv(lora_stream.ENV, "5")
    assert lora_stream.max_tokens() == bound
    assert lora_stream.in_place(bound + 1) and not lora_stream.in_place(bound)


def test_installs_on_vllms_triton_experts_and_comes_off() -> None:
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    before = TritonExperts.__dict__["apply"]
    patches = Patches()
    assert lora_stream.install_lora_stream(patches) is None  # the installed vLLM has the pinned signature
    try:
        assert TritonExperts.__dict__["apply"] is lora_stream.experts_apply
        assert lora_stream._original == {"apply": before}
    finally:
        patches.undo()
    assert TritonExperts.__dict__["apply"] is before and not lora_stream._original


def test_a_changed_signature_is_left_alone(monkeypatch) -> None:
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    def changed(self, output, hidden_states, stream):
        return None

    monkeypatch.setattr(TritonExperts, "apply", changed)
    assert lora_stream.install_lora_stream(Patches()) == "TritonExperts.apply is not the pinned one"
    assert TritonExperts.__dict__["apply"] is changed


# ---- the stream's priority ----


@pytest.fixture
def lora_layers(monkeypatch):
    """vLLM's LoRA-stream module with no stream made yet, on a CUDA-like platform with the dual stream on, and
    `new_stream` recording each stream it makes (torch here has no CUDA)."""
    from vllm.lora.layers import base_linear, fused_moe, utils

    made: list[object] = []

    def new_stream() -> SimpleNamespace:
        made.append(SimpleNamespace(priority=-5))
        return made[-1]

    monkeypatch.setattr(utils, "_lora_aux_cuda_stream", None)
    monkeypatch.setattr(utils, "current_platform", SimpleNamespace(is_cuda_alike=lambda: True))
    monkeypatch.setenv("VLLM_LORA_ENABLE_DUAL_STREAM", "1")
    monkeypatch.setattr(lora_stream, "new_stream", new_stream)
    monkeypatch.delenv(lora_stream.PRIORITY_ENV, raising=False)
    return SimpleNamespace(utils=utils, modules=(utils, base_linear, fused_moe), made=made)


def test_vllms_layers_get_the_stream_made_at_the_highest_priority_once(lora_layers) -> None:
    vllms = lora_layers.utils._get_lora_aux_cuda_stream
    patches = Patches()
    assert lora_stream.install_stream_priority(patches) is None
    try:
        assert lora_layers.made == []  # made where vLLM makes it: when the first LoRA layer asks
        getters = [module._get_lora_aux_cuda_stream for module in lora_layers.modules]
        streams = [get() for get in getters]
        assert lora_layers.made and streams == [lora_layers.made[0]] * 3
        assert lora_layers.utils._lora_aux_cuda_stream is lora_layers.made[0]
    finally:
        patches.undo()
    assert all(module._get_lora_aux_cuda_stream is vllms for module in lora_layers.modules)


def test_without_the_dual_stream_no_stream_is_made(lora_layers, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_LORA_ENABLE_DUAL_STREAM", "0")
    patches = Patches()
    assert lora_stream.install_stream_priority(patches) is None
    try:
        assert lora_layers.utils._get_lora_aux_cuda_stream() is None and lora_layers.made == []
    finally:
        patches.undo()


@pytest.mark.parametrize("case", ["normal", "made before", "bound elsewhere"])
def test_vllms_stream_stays_where_asked_or_where_the_plugin_is_too_late(lora_layers, monkeypatch, case) -> None:
    from vllm.lora.layers import fused_moe

    if case == "normal":
        monkeypatch.setenv(lora_stream.PRIORITY_ENV, "Normal")
        expected = f"{lora_stream.PRIORITY_ENV}=normal"
    elif case == "made before":
        monkeypatch.setattr(lora_layers.utils, "_lora_aux_cuda_stream", "vLLM's")
        expected = "vLLM's LoRA stream was made before the plugin loaded"
    else:
        monkeypatch.setattr(fused_moe, "_get_lora_aux_cuda_stream", lambda: None)
        expected = "vLLM's _get_lora_aux_cuda_stream is not bound where it was read"
    before = [module._get_lora_aux_cuda_stream for module in lora_layers.modules]
    patches = Patches()
    assert lora_stream.install_stream_priority(patches) == expected
    assert patches.done == []
    assert [module._get_lora_aux_cuda_stream for module in lora_layers.modules] == before
