"""Whether this compile cache was already warmed for the same server, so that a second pod through
`spec.kernels.compileCache` can skip the model warm-up (model_warmup.py): Triton's cache then holds every kernel
variant that warm-up compiles, and a variant a request meets later is read from it rather than compiled under it.

The marker is a file in Triton's cache directory named by a digest of what picks the variants a warm-up meets:
vLLM's own config hash (the one that names its torch.compile cache: model, LoRA, compilation, parallelism and the
environment vLLM hashes), the warm-up's token counts and LoRA slots, the vLLM, torch and Triton versions, the GPU,
moelora's kernels and tables, the tuned-config folder and the MOELORA_* switches but those that only diagnose or
act on the host (HOST_SWITCHES: profiling the start-up for where it goes must not make it run the warm-up it would
skip, as it did on 2026-12-06, docs/benchmarks.md). A marker missed costs a warm-up;
one matched wrongly costs a compile under a request, as without the plugin, never a wrong result (Triton keys each
cached kernel by its own content).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
from typing import Any

from . import COMPILE_LOG_ENV, adapter_pinning, dummy_loras, host_adapters, startup_gc, startup_profile

__all__ = ["HOST_SWITCHES", "MARKER_DIR", "digest", "is_marked", "mark"]

log = logging.getLogger("vllm.moelora_plugin")

MARKER_DIR = "moelora-warm-up"  # inside Triton's cache directory, beside its own hash-named entries
# Switches that pick no kernel variant: diagnostics, and the handling of adapters and of the heap in host memory.
HOST_SWITCHES = frozenset(
    {
        startup_profile.PROFILE_ENV,
        startup_profile.FROM_ENV,
        startup_profile.BY_ENV,
        startup_profile.GC_ENV,
        COMPILE_LOG_ENV,
        startup_gc.ENV,
        host_adapters.AHEAD_ENV,
        host_adapters.ENV,
        adapter_pinning.ENV,
        dummy_loras.ENV,
    }
)


def digest(worker: Any, counts: list[int], active: int) -> str | None:
    """The marker's name for this server's warm-up, or None when vLLM's config hash cannot be had (then never skip)."""
    try:
        vllm_hash = worker.vllm_config.compute_hash()
    except Exception:  # noqa: BLE001  (no hash: the warm-up runs, as it always did)
        return None
    import torch
    import triton
    import vllm

    import moelora.kernels

    facts = {
        "vllm_config": vllm_hash,
        "counts": counts,
        "lora_slots": active,
        "versions": [vllm.__version__, torch.__version__, triton.__version__],
        "device": _device(torch),
        "moelora": _files_digest(pathlib.Path(__file__).parent, pathlib.Path(moelora.kernels.__file__).parent),
        "tuned_configs": _files_digest(*_tuned_folder()),
        "switches": sorted(
            (k, v) for k, v in os.environ.items() if k.startswith("MOELORA_") and k not in HOST_SWITCHES
        ),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def is_marked(name: str) -> bool:
    return (_directory() / name).is_file()


def mark(name: str) -> None:
    """Record a finished warm-up; a cache that cannot be written is left as it is (the next pod warms up again)."""
    directory = _directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f".{name}.{os.getpid()}"
        partial.write_text("moelora model warm-up finished with this cache\n")
        os.replace(partial, directory / name)  # atomic: pods sharing the cache never see half a marker
    except OSError as exc:
        log.info("moelora: warm-up marker not written in %s: %r", directory, exc)


def _directory() -> pathlib.Path:
    try:
        from triton import knobs

        base = knobs.cache.dir
    except (ImportError, AttributeError):  # a Triton before knobs: its documented variable and default
        base = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return pathlib.Path(base) / MARKER_DIR


def _device(torch: Any) -> list[Any]:
    if not torch.cuda.is_available():
        return ["cpu"]
    return [torch.cuda.get_device_name(), list(torch.cuda.get_device_capability())]


def _tuned_folder() -> tuple[pathlib.Path, ...]:
    folder = os.environ.get("VLLM_TUNED_CONFIG_FOLDER")
    return (pathlib.Path(folder),) if folder else ()


def _files_digest(*roots: pathlib.Path) -> str:
    """Every .py and .json file under the roots, by relative path and content."""
    h = hashlib.sha256()
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
