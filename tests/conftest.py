"""Settings every test folder depends on, fixed before any folder's own conftest is imported."""

import os
import shutil
import tempfile

# Triton decides interpreted-or-compiled when a kernel is *defined*, so the choice must be made before the first
# test module imports moelora.kernels. Without a GPU, every kernel runs in the interpreter (tests/gpu then skips);
# on a GPU machine run tests/gpu in its own process (see tests/gpu/conftest.py).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The agent and vLLM's plugin share the admin key and the agent's resolver address through files beside
# MOELORA_ADMIN_KEY_FILE, by default a machine-wide path: an agent a test started would leave its address there for
# every later vLLM (unknown names 503, not 404). Each test process gets its own.
os.environ.setdefault("MOELORA_ADMIN_KEY_FILE", os.path.join(tempfile.mkdtemp(prefix="moelora-admin-"), "key"))

import pytest  # noqa: E402

# What is not a unit test: folders whose tests run other programs (helm, hadolint, bash, kubectl), Triton kernels in
# the interpreter, torch or vLLM; modules that start a server inline; and any test using a fixture that starts a
# server (the API emulator, an S3 server, vLLM) or builds a model on disk, directly or through another fixture.
INTEGRATION_FOLDERS = frozenset({"chart", "image", "kernels", "plugin", "e2e", "chaos", "gpu"})
INTEGRATION_MODULES = frozenset(
    {
        "tests/architecture/test_closure.py",  # a fresh interpreter per image
        "tests/operator/test_vllm_flags.py",  # imports vLLM
        "tests/operator/test_rendered_flags.py",  # vLLM parses the flags
        "tests/operator/test_main.py",  # starts the operator process
        "tests/local/test_main_signals.py",  # starts the whole local stack
        "tests/local/test_stack_model_cache.py",  # starts the whole local stack
        "tests/agent/test_kube.py",  # starts API emulators of its own
    }
)
SERVER_FIXTURES = frozenset({"kube", "api", "s3_endpoint", "vllm_url", "tiny", "local"})
# Each takes several minutes (docs/development.md, test tiers).
LONGEST = ("tests/e2e/test_placement.py", "tests/e2e/test_adapters.py", "tests/chaos/test_agent_kills.py")


# First, so that `-m` deselects on these marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root)
        if (
            path.parts[1] in INTEGRATION_FOLDERS
            or path.as_posix() in INTEGRATION_MODULES
            or SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.integration)
    # The longest modules first, then the others that start vLLM, then the rest (order within a module kept; the
    # Makefile passes --no-loadscope-reorder, or xdist would order modules by their test count instead): with
    # several workers the long ones run side by side instead of one of them ending the run alone.
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path.relative_to(root).as_posix() not in LONGEST, item.path not in slow))
