"""The bundled flag list must match the installed vLLM's parser.

Regenerate it with `python -m moelora.operator.vllmflags`.
"""

from __future__ import annotations

import json
import subprocess
import sys

from moelora.operator import vllmflags
from moelora.operator.engine import MANAGED_FLAGS


def test_bundled_flags_are_those_of_the_installed_vllm() -> None:
    # A subprocess: importing vLLM takes seconds and loads torch; keep it out of the test process.
    code = "import json; from moelora.operator import vllmflags; print(json.dumps(vllmflags.flags_from_vllm()))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    version, flags = json.loads(result.stdout.strip().splitlines()[-1])
    assert vllmflags.bundled_version() == version, "regenerate: python -m moelora.operator.vllmflags"
    assert vllmflags.flag_arity() == flags, "regenerate: python -m moelora.operator.vllmflags"


def test_every_flag_moelora_manages_is_a_real_vllm_flag() -> None:
    # A managed flag vLLM renamed would silently stop being refused.
    assert MANAGED_FLAGS <= vllmflags.known_flags()
