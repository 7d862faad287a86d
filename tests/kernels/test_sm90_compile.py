"""Every kernel compiles for an H100/H200 (sm_90) on this CPU-only machine.

The interpreter the other kernel tests use runs the Python of a kernel, not Triton's compiler: it accepts what the
compiler rejects (a module global that is not a tl.constexpr, for one, which once reached the GPU that way). This runs
kernels/scripts/sm90_ptx.py, which compiles the op's and the routing's kernels ahead of time with the launcher's
specialisation, in a process without TRITON_INTERPRET.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "kernels" / "scripts" / "sm90_ptx.py"


def test_all_kernels_compile_for_sm90_without_spills_in_the_op():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if re.search(r"regs +\d+ stack +\d+", line)]
    kinds = {line.split(":")[0].split()[0] + " " + line.split(":")[0].split()[1] for line in lines}
    assert {
        "expand direct=0",
        "expand direct=1",
        "shrink direct=0",
        "shrink direct=1",
        "route tiny",
        "route finish",
        "route count",
        "onepass per_pair=0",
        "onepass per_pair=1",
        "dense add=0",
        "dense add=1",
        "folded slices=3",
        "folded slices=1",
    } <= kinds, kinds
    # The op's kernels must not spill to the stack (the tiny routing's comparison matrices do, by design).
    spilled = [
        line for line in lines if line.startswith(("expand", "shrink", "onepass")) and " stack    0 " not in line
    ]
    assert not spilled, spilled
