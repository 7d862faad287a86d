"""The bundled flag list must match the installed vLLM's parser.

Regenerate it with `python -m moelora.local.vllm_flags`.
"""

from __future__ import annotations

import json
import subprocess
import sys

from moelora.operator import vllm_flags
from moelora.operator.engine import MANAGED_FLAGS


def test_bundled_flags_are_those_of_the_installed_vllm() -> None:
    # A subprocess: importing vLLM takes seconds and loads torch; keep it out of the test process.
    code = "import json; from moelora.local import vllm_flags; print(json.dumps(vllm_flags.flags_from_vllm()))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    version, flags = json.loads(result.stdout.strip().splitlines()[-1])
    assert vllm_flags.bundled_version() == version, "regenerate: python -m moelora.local.vllm_flags"
    assert vllm_flags.flag_arity() == flags, "regenerate: python -m moelora.local.vllm_flags"


def test_every_flag_moelora_manages_is_a_real_vllm_flag() -> None:
    # A managed flag vLLM renamed would silently stop being refused.
    assert MANAGED_FLAGS <= vllm_flags.known_flags()
