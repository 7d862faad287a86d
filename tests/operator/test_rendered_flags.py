"""The flags the operator renders, parsed by the installed vLLM's own parser (as the server would at start-up)."""

from __future__ import annotations

import json
import subprocess
import sys

from moelora.operator.render import engine

from .conftest import make_spec

_PARSE = """
import importlib, json, sys
for optional in ("torchaudio", "torchcodec"):
    sys.modules.setdefault(optional, None)
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
module, _, name = args.middleware[0].rpartition(".")
getattr(importlib.import_module(module), name)  # what vLLM's app builder does with it
print(json.dumps({"middleware": args.middleware, "api_key": args.api_key, "enable_lora": args.enable_lora}))
"""


def test_vllm_parses_the_rendered_flags_and_finds_the_admin_guard() -> None:
    spec = make_spec(gpus=2, lora={"maxCpuLoras": 16}, engineArgs=["--max-model-len=4096"])
    argv = engine.vllm_args(spec, name="srv")
    # A subprocess: importing vLLM takes seconds and loads torch; keep it out of the test process.
    result = subprocess.run(
        [sys.executable, "-c", _PARSE, json.dumps(argv)], capture_output=True, text=True, timeout=300, check=True
    )
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed == {"middleware": [engine.ADMIN_GUARD], "api_key": None, "enable_lora": True}
