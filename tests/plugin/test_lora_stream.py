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


def test_the_dense_bound_is_the_bound_unless_set(monkeypatch, fresh_bound) -> None:
    monkeypatch.setenv(lora_stream.ENV, "300")
    monkeypatch.delenv(lora_stream.DENSE_ENV, raising=False)
    assert lora_stream.dense_max_tokens() == 300
    lora_stream.max_tokens.cache_clear()
    lora_stream.dense_max_tokens.cache_clear()
    monkeypatch.setenv(lora_stream.DENSE_ENV, "0")
    assert (lora_stream.max_tokens(), lora_stream.dense_max_tokens()) == (300, 0)
    assert lora_stream.dense_in_place(1) and not lora_stream.in_place(1)


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
