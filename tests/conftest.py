"""Settings every test folder depends on, fixed before any folder's own conftest is imported."""

import os
import shutil

# Triton decides interpreted-or-compiled when a kernel is *defined*, so the choice must be made before the first
# test module imports moelora.kernels. Without a GPU, every kernel runs in the interpreter (tests/gpu then skips);
# on a GPU machine run tests/gpu in its own process (see tests/gpu/conftest.py).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
