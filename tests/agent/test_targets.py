"""target_modules and the peft features vLLM does not serve, judged from adapter_config.json before any download."""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any

import pytest

from moelora.agent.check import basemodel, targets
from moelora.agent.check.validate import Limits, check_config
from moelora.agent.errors import AdapterError
from moelora.api import FailureReason

from .conftest import BASE_MODEL
from .hostile import LLAMA, QWEN3_MOE, base_config, config

ANY = frozenset[str]()
ATTENTION = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})


def limits(tmp_path: pathlib.Path, model: dict[str, Any] | None = LLAMA, allowed: frozenset[str] = ANY) -> Limits:
    path = base_config(tmp_path / "base", model) if model else None
    return Limits(base_model=BASE_MODEL, max_rank=16, target_modules=allowed, max_bytes=1 << 20, base_config=path)


def reason(adapter_config: dict[str, Any], server: Limits) -> FailureReason | None:
    try:
        check_config(adapter_config, server)
    except AdapterError as error:
        return error.reason
    return None


@pytest.mark.parametrize(
    ("modules", "model", "allowed", "expected"),
    [
        (".*", LLAMA, ANY, FailureReason.UNKNOWN_TARGET_MODULES),  # matches model.norm, the layers, ...
        (r"model\.layers\.\d+\.self_attn\.(q|v)_proj", LLAMA, ANY, None),
        (r".*\.(q|v)_proj", LLAMA, ATTENTION, None),
        (r".*_proj", LLAMA, ATTENTION, FailureReason.UNSUPPORTED_TARGET_MODULES),  # gate/up/down too
        (r".*\.experts\.\d+\.(gate|up|down)_proj", QWEN3_MOE, ANY, None),
        (r".*\.experts", QWEN3_MOE, ANY, FailureReason.UNKNOWN_TARGET_MODULES),  # the container, not a linear
        (r".*mlp\.gate", QWEN3_MOE, ANY, None),  # the router
        (r"q_proj", LLAMA, ANY, FailureReason.UNKNOWN_TARGET_MODULES),  # a full match of nothing
        ("all-linear", LLAMA, ANY, None),
        ("all-linear", LLAMA, ATTENTION, FailureReason.UNSUPPORTED_TARGET_MODULES),
        ("(", LLAMA, ANY, FailureReason.CONFIG_INVALID),
        (".*", None, ANY, None),  # no base model to judge it against: only the server's list applies
        (".*", None, ATTENTION, FailureReason.UNSUPPORTED_TARGET_MODULES),
        (["q_proj", "self_attn.v_proj", "model.layers.1.self_attn.k_proj", "lm_head"], LLAMA, ANY, None),
        (["q_proj", "w1"], LLAMA, ANY, FailureReason.UNKNOWN_TARGET_MODULES),
        (["mlp"], LLAMA, ANY, FailureReason.UNKNOWN_TARGET_MODULES),
        (["layers.2.self_attn.q_proj"], LLAMA, ANY, FailureReason.UNKNOWN_TARGET_MODULES),  # 2 layers: 0 and 1
        (["experts.3.gate_proj", "gate"], QWEN3_MOE, ANY, None),
        (["experts.4.gate_proj"], QWEN3_MOE, ANY, FailureReason.UNKNOWN_TARGET_MODULES),  # 4 experts: 0 to 3
        (["q_proj", "gate_proj"], LLAMA, ATTENTION, FailureReason.UNSUPPORTED_TARGET_MODULES),
        (["w1"], None, ANY, None),
    ],
)
def test_target_modules(
    tmp_path: pathlib.Path, modules: Any, model: dict[str, Any] | None, allowed: frozenset[str], expected: Any
) -> None:
    assert reason(config(modules=modules), limits(tmp_path, model, allowed)) is expected


EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


@pytest.mark.parametrize(
    ("parameters", "allowed", "expected"),
    [
        (EXPERTS, ANY, None),
        (EXPERTS, ATTENTION | {"gate_up_proj", "down_proj"}, None),  # GPT-OSS's names
        (EXPERTS, ATTENTION | {"gate_proj", "up_proj", "down_proj"}, None),  # a fused gate_up_proj is gate and up
        (EXPERTS, ATTENTION, FailureReason.UNSUPPORTED_TARGET_MODULES),  # vLLM would build no expert LoRA
        (EXPERTS, ATTENTION | {"gate_proj", "down_proj"}, FailureReason.UNSUPPORTED_TARGET_MODULES),  # up not allowed
        (["mlp.experts.down_proj"], ATTENTION | {"down_proj"}, None),
    ],
)
def test_target_parameters_are_held_to_the_servers_modules(
    tmp_path: pathlib.Path, parameters: list[str], allowed: frozenset[str], expected: Any
) -> None:
    adapter = config(modules=["q_proj"], target_parameters=parameters)
    assert reason(adapter, limits(tmp_path, QWEN3_MOE, allowed)) is expected


def test_a_refused_target_parameter_is_named(tmp_path: pathlib.Path) -> None:
    with pytest.raises(AdapterError) as caught:
        check_config(config(modules=["q_proj"], target_parameters=EXPERTS), limits(tmp_path, QWEN3_MOE, ATTENTION))
    assert "target_parameters ['mlp.experts.gate_up_proj', 'mlp.experts.down_proj']" in caught.value.message


def test_a_sweeping_pattern_is_refused_naming_what_it_matches(tmp_path: pathlib.Path) -> None:
    with pytest.raises(AdapterError) as caught:
        check_config(config(modules=".*"), limits(tmp_path))
    assert "matches modules that are not LoRA-targetable: ['model', 'model.embed_tokens'" in caught.value.message


def test_a_pattern_that_backtracks_forever_is_stopped(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exponential backtracking would hold the GIL, and so the whole agent: it runs in another interpreter."""
    monkeypatch.setattr(targets, "MATCH_SECONDS", 1.0)
    started = time.monotonic()
    assert reason(config(modules="(.|.)*Z"), limits(tmp_path)) is FailureReason.CONFIG_INVALID
    assert time.monotonic() - started < 10


def test_a_pattern_is_matched_once_per_base_model(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = limits(tmp_path)
    pattern = r"model\.layers\.0\.self_attn\.q_proj"
    assert reason(config(modules=pattern), server) is None

    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("matched again")

    monkeypatch.setattr(targets.subprocess, "run", no_child)
    assert reason(config(modules=pattern), server) is None


def test_every_targetable_module_is_a_module_the_tensor_checks_know() -> None:
    base = basemodel.from_config(QWEN3_MOE)
    names = targets.targetable(base)
    assert len(names) == 1 + 2 * (4 + 1 + 4 * 3)  # lm_head; per layer attention, router, 4 experts x 3
    assert all(base.dims(name) is not None for name in names)
    assert not {base.dims(name) for name in targets.containers(base)} - {None}


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"modules_to_save": ["lm_head", "embed_tokens"]}, "modules_to_save ['lm_head', 'embed_tokens']"),
        ({"modules_to_save": ["score"]}, "modules_to_save"),
        ({"use_dora": True}, "DoRA"),
        ({"lora_bias": True}, "lora_bias"),
        ({"init_lora_weights": "pissa_niter_4"}, "pissa_niter_4"),
        ({"init_lora_weights": "loftq"}, "loftq"),
        ({"layer_replication": [[0, 2]]}, "layer_replication"),
        ({"alora_invocation_tokens": [1, 2]}, "alora_invocation_tokens"),
        ({"use_qalora": True}, "QALoRA"),
    ],
)
def test_peft_features_vllm_does_not_serve(tmp_path: pathlib.Path, extra: dict[str, Any], words: str) -> None:
    with pytest.raises(AdapterError) as caught:
        check_config(config(**extra), limits(tmp_path))
    assert caught.value.reason is FailureReason.UNSUPPORTED_FEATURE
    assert words in caught.value.message


@pytest.mark.parametrize(
    "extra",
    [{"modules_to_save": None}, {"modules_to_save": []}, {"init_lora_weights": "gaussian"}, {"use_dora": False}],
)
def test_features_left_off_pass(tmp_path: pathlib.Path, extra: dict[str, Any]) -> None:
    assert reason(config(**extra), limits(tmp_path)) is None


def test_the_base_models_own_list_is_used_when_the_server_lists_none(tmp_path: pathlib.Path) -> None:
    server = dataclasses.replace(limits(tmp_path), target_modules=frozenset())
    assert reason(config(modules=["gate_proj", "down_proj"]), server) is None
