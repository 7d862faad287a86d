"""One compiled variant per launch configuration serves every token count.

Triton specialises integer arguments on their value class (1, a multiple of 16, other) unless told not to, so an
argument that moves with the batch size would compile a new variant in the middle of serving. On the H200 kit that
cost the first burst of requests ~3 s of time to first token: `max_blocks` (the routing's block capacity, which grows
with the token count) was specialised. The interpreter the other kernel tests use ignores these flags, so this reads
the real JITFunctions, in a process without TRITON_INTERPRET (building them needs no GPU).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

# Every integer argument of our kernels whose value follows the batch's token count.
TOKEN_DEPENDENT = {"num_pairs", "max_blocks", "ready_len", "M", "m", "num_tokens", "n_split", "k_tiles", "n_tiles"}

PROBE = """
import json
from moelora.kernels import block_layout, expand, onepass, routing, shrink, tiles
out = {}
for mod in (shrink, expand, onepass, tiles, routing, block_layout):
    for name in dir(mod):
        fn = getattr(mod, name)
        if type(fn).__name__ == "JITFunction":
            out[name] = {p.name: bool(p.do_not_specialize) for p in fn.params if not p.is_constexpr}
print(json.dumps(out))
"""


def test_token_count_arguments_are_not_specialised():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "kernels") + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kernels = json.loads(done.stdout.strip().splitlines()[-1])
    launched = {
        "_shrink_kernel",
        "_expand_kernel",
        "_route_count_kernel",
        "_route_finish_kernel",
        "_route_tiny_kernel",
        "_scatter_block_experts_kernel",
        "_onepass_kernel",
    }
    assert launched <= set(kernels), sorted(kernels)
    specialised = sorted(
        (name, arg) for name in launched for arg, off in kernels[name].items() if arg in TOKEN_DEPENDENT and not off
    )
    assert not specialised, specialised
    # and the flag is really there for the argument that was missed before
    assert kernels["_shrink_kernel"]["max_blocks"] and kernels["_expand_kernel"]["max_blocks"]
