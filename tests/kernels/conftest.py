"""CPU tests of the Triton kernels: they run in Triton's interpreter (set before any kernel module is imported).

Run this folder in its own pytest process: Triton decides interpreted-or-compiled when a kernel is defined, so
tests/gpu (compiled) and this folder (interpreted) cannot share one process.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import contextlib

import pytest
import torch


@pytest.fixture
def vllm_lookup(monkeypatch):
    """vLLM's own tuned-config lookup (vllm.lora.ops.triton_ops.utils) reading a folder as on an H200: call it with
    the folder, use the module it yields; its caches are cleared before and after."""

    @contextlib.contextmanager
    def lookup(folder):
        from vllm.lora.ops.triton_ops import utils as vllm_utils

        monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(folder))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H200")
        monkeypatch.setattr(vllm_utils, "is_batch_invariant", False, raising=False)
        vllm_utils.load_lora_op_config.cache_clear()
        vllm_utils.get_lora_op_configs.cache_clear()
        try:
            yield vllm_utils
        finally:
            vllm_utils.load_lora_op_config.cache_clear()
            vllm_utils.get_lora_op_configs.cache_clear()

    return lookup
