"""CPU tests of the Triton kernels: they run in Triton's interpreter (set before any kernel module is imported).

Run this folder in its own pytest process: Triton decides interpreted-or-compiled when a kernel is defined, so
tests/gpu (compiled) and this folder (interpreted) cannot share one process.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
