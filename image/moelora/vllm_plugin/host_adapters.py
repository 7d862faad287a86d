"""Adapters read and merged in host memory before vLLM asks for them, and the last load kept for a second one.

vLLM loads an adapter on its engine thread when asked (`WorkerLoRAManager._load_adapter`: read the files, then the
manager merges them), one after another, and only once the engine is up. A new pod therefore spends its start-up
first, then every adapter's read and merge in turn before its agent calls it Ready; and the agent loads each new
adapter twice (under a random name for its output check, then under the adapter's own), which vLLM reads twice.

Installed, the plugin's `_load_adapter` returns the adapter merged, and remembers the last one by its files' identity
(path, and each file's size, mtime and inode): loading the same files again gets a clone sharing its tensors
(`LoRAModel.clone`), not a second read. With `MOELORA_ADAPTERS_AHEAD_DIR` set (the agent's cache, where a directory
appears only complete and checked), a thread starts when vLLM creates its LoRA manager and reads and merges, one at a
time while the engine warms up, the newest adapter directories there, up to the manager's capacity and until the
first load; a load of one of them takes that copy. Nothing read ahead is served unless vLLM is asked for the same
files; copies not asked for within `KEEP_S` of the first load are dropped.

A reader thread reads and merges with no CUDA call (vLLM's merge with its pinning off: adapter_pinning.py, or a
platform without pinned memory) and hands each adapter to a pinning thread, which pins it in one buffer outside
CUDA-graph capture: a capture forbids pinned host allocations from any thread (it invalidates the capture, and the
engine fails to start), so each of vLLM's two capture phases, `profile_cudagraph_memory` and `capture_model`, and each
pin take one lock. The reader goes on while a pin waits out a capture (with 3.38 GB adapters a capture outlasts
several reads). vLLM's V2 model runner captures in methods of its own, out of the lock's reach, so there nothing is
read ahead. A copy not pinned yet (the pin failed) is pinned on the engine thread when taken.
While a read runs, the interpreter's thread switch interval is cut to `SWITCH_S`: the engine thread lets go of the GIL
in every torch call and waits up to that interval to take it back from a reader running Python (the read-ahead made
a GPT-OSS second pod's engine init 5 s longer on 2026-12-05, docs/benchmarks.md).
`MOELORA_HOST_ADAPTERS=0` keeps vLLM's loading as it is.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from . import startup_profile
from .contract import CAPTURE_PARAMETERS, CLONE_PARAMETERS, CREATE_LORA_MANAGER_PARAMETERS, LOAD_ADAPTER_PARAMETERS
from .patches import Patches

__all__ = ["AHEAD_ENV", "ENV", "HostAdapters", "adapter_dirs", "identity", "install_host_adapters"]

log = logging.getLogger("vllm.moelora_plugin")

ENV = "MOELORA_HOST_ADAPTERS"
AHEAD_ENV = "MOELORA_ADAPTERS_AHEAD_DIR"
MERGED = "moelora_merged"  # set on a LoRAModel already merged: the manager's merge skips it
CONFIG = "adapter_config.json"
POLL_S = 1.0  # how often the thread looks for new adapter directories before the first load
WINDOW_S = 1800.0  # it stops looking after this long even when no load comes
KEEP_S = 300.0  # copies read ahead and not taken this long after the first load are dropped
# While a read ahead runs, the interpreter's thread switch interval (5 ms by default) is at most this: every torch call
# of the engine thread lets go of the GIL, and taking it back from a reader running Python waits up to the interval.
SWITCH_S = 0.0005

Key = tuple[str, tuple[tuple[str, int, int, int], ...], bool]


def identity(path: str, is_3d: bool) -> Key | None:
    """The adapter directory's files as they are now, or None if it cannot be read. Equal keys mean the same bytes
    unless a file was rewritten in place with its size and mtime kept (the agent's cache renames whole directories)."""
    try:
        with os.scandir(path) as entries:
            files = tuple(
                sorted(
                    (e.name, s.st_size, s.st_mtime_ns, s.st_ino) for e in entries if e.is_file() for s in (e.stat(),)
                )
            )
    except OSError:
        return None
    return (os.path.realpath(path), files, is_3d)


def adapter_dirs(root: str) -> list[str]:
    """Adapter directories directly under `root`, newest first; dot-named ones (the agent's partial downloads) are
    not adapters yet."""
    found = []
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                try:
                    found.append((os.stat(os.path.join(entry.path, CONFIG)).st_mtime_ns, entry.path))
                except OSError:
                    continue
    except OSError:
        return []
    return [path for _, path in sorted(found, reverse=True)]


class HostAdapters:
    """Merged adapters by file identity: those read ahead (futures) and the last one loaded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ahead: dict[Key, concurrent.futures.Future] = {}
        self._last: tuple[Key, Any] | None = None
        self.loading = threading.Event()  # set at the first load: nothing new is read ahead after it

    def ahead(self, key: Key, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._ahead[key] = future

    def remember(self, key: Key, model: Any) -> None:
        with self._lock:
            self._last = (key, model)

    def take(self, key: Key) -> tuple[Any, str] | None:
        """The merged model for these files and where it came from, or None: read them. A copy read ahead but not
        started is cancelled (the caller reads); one being read is waited for; one that failed is dropped with a
        warning, and the caller's own read then reports the error as vLLM would."""
        with self._lock:
            if self._last is not None and self._last[0] == key:
                return self._last[1], "its last load"
            future = self._ahead.pop(key, None)
        if future is None or future.cancel():
            return None
        try:
            model = future.result()
            if isinstance(model, concurrent.futures.Future):  # read, and handed to the pinning thread
                model = model.result()
        except Exception as exc:  # noqa: BLE001  (the engine thread's own read raises vLLM's error for it)
            log.warning("moelora: reading %s ahead failed: %r", key[0], exc)
            return None
        self.remember(key, model)
        return model, "the copy read ahead"

    def drop_ahead(self) -> int:
        with self._lock:
            futures, self._ahead = list(self._ahead.values()), {}
        for future in futures:
            if not future.cancel() and future.done() and future.exception() is None:
                pinning = future.result()
                if isinstance(pinning, concurrent.futures.Future):
                    pinning.cancel()  # not pinned yet: a copy nobody takes need not be
        return len(futures)


_switch = {"users": 0, "saved": 0.0}
_switch_lock = threading.Lock()


def _short_switch(read: Callable[[str], Any], path: str) -> Any:
    """read(path) with the switch interval at most SWITCH_S meanwhile; the first of overlapping reads (two LoRA
    managers in one process) lowers it, the last restores what was there before."""
    with _switch_lock:
        if _switch["users"] == 0:
            _switch["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch["saved"], SWITCH_S))
        _switch["users"] += 1
    try:
        return read(path)
    finally:
        with _switch_lock:
            _switch["users"] -= 1
            if _switch["users"] == 0:
                sys.setswitchinterval(_switch["saved"])


def _read_ahead(
    store: HostAdapters,
    root: str,
    capacity: int,
    read: Callable[[str], Any],
    on_start: Callable[[], None],
    pin: Callable[[Any, str, float], Any] | None = None,
) -> None:
    """The thread's loop: submit each new adapter directory under `root` to one reader (which runs `on_start` first)
    until the first load, the manager's capacity or the window's end; then drop what was not taken within KEEP_S.
    With `pin`, what the reader returns goes on to one pinning thread (`on_start` first too) as pin(model, path, when
    read), in order, and the reader's result is that pin's future, so the reader does not wait for a pin."""
    reader, pinner = (
        concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=on_start)
        for name in ("moelora-adapters-ahead", "moelora-adapters-pin")
    )

    def job(path: str) -> Any:
        model = _short_switch(read, path)
        return model if pin is None else pinner.submit(pin, model, path, time.monotonic())

    seen: set[Key] = set()
    deadline = time.monotonic() + WINDOW_S
    while not store.loading.is_set() and len(seen) < capacity and time.monotonic() < deadline:
        for path in adapter_dirs(root):
            key = identity(path, False)
            if key is not None and key not in seen and len(seen) < capacity:
                seen.add(key)
                store.ahead(key, reader.submit(job, path))
        store.loading.wait(POLL_S)
    store.loading.wait(max(0.0, deadline - time.monotonic()))
    time.sleep(KEEP_S)
    dropped = store.drop_ahead()
    reader.shutdown(wait=False)
    pinner.shutdown(wait=False)
    if dropped:
        log.info("moelora: dropped %d adapter(s) read ahead and not loaded", dropped)


def install_host_adapters(patches: Patches, *, start: Callable[[Callable[[], None]], None] | None = None) -> str | None:
    """Merge at load, keep the last load, read ahead where `AHEAD_ENV` says; None when installed, else why not
    (nothing changed). `start` runs the read-ahead loop (a daemon thread unless a test passes its own)."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    import vllm.lora.lora_model as lora_model_module
    import vllm.lora.model_manager as manager_module
    import vllm.lora.worker_manager as worker_module
    import vllm.v1.worker.gpu_model_runner as runner_module
    from vllm.lora.request import LoRARequest
    from vllm.lora.utils import get_adapter_absolute_path

    worker_cls, lru_cls = worker_module.WorkerLoRAManager, worker_module.LRUCacheWorkerLoRAManager
    manager_cls, runner_cls = manager_module.LoRAModelManager, runner_module.GPUModelRunner
    originals = []
    for owner, name, expected in (
        (runner_cls, "capture_model", CAPTURE_PARAMETERS),
        (runner_cls, "profile_cudagraph_memory", CAPTURE_PARAMETERS),
        (worker_cls, "_load_adapter", LOAD_ADAPTER_PARAMETERS),
        (lru_cls, "create_lora_manager", CREATE_LORA_MANAGER_PARAMETERS),
        (lora_model_module.LoRAModel, "clone", CLONE_PARAMETERS),
    ):
        found = vars(owner).get(name)
        if found is None or tuple(inspect.signature(found).parameters) != expected:
            return f"vLLM's {owner.__name__}.{name} is not {expected}"
        originals.append(found)
    capture, profile_graphs, load, create, _ = originals
    capturing = threading.RLock()  # re-entrant: a capture phase that ran the other inside it must not wait on itself
    merge = manager_cls._create_merged_loras_inplace
    # What the read-ahead thread may run: vLLM's merge without the plugin's pinning, and that pinning for later.
    unpinned, pin = getattr(merge, "moelora_unpinned", merge), getattr(merge, "moelora_pin", lambda model: None)
    vllm_pins = getattr(manager_module, "PIN_MEMORY", False) or getattr(lora_model_module, "PIN_MEMORY", False)
    store = HostAdapters()

    def _load_adapter(self, lora_request):
        store.loading.set()
        if getattr(lora_request, "tensorizer_config_dict", None):
            return load(self, lora_request)  # not read from files this part can identify
        key = identity(
            get_adapter_absolute_path(lora_request.lora_path), bool(getattr(lora_request, "is_3d_lora_weight", False))
        )
        found = store.take(key) if key is not None else None
        if found is None:
            model = load(self, lora_request)
            self._adapter_manager._create_merged_loras_inplace(model)
            setattr(model, MERGED, True)
            if key is not None:
                store.remember(key, model)
            return model
        model, source = found
        pin(model)  # only a copy whose pin failed ahead is pinned here; a model pinned already is left as it is
        copy = model.clone(lora_request.lora_int_id)
        setattr(copy, MERGED, True)
        log.info("moelora: adapter %s (%s) from %s", lora_request.lora_int_id, lora_request.lora_name, source)
        return copy

    def _create_merged_loras_inplace(self, lora_model):
        if not getattr(lora_model, MERGED, False):
            merge(self, lora_model)

    def create_lora_manager(self, model, vllm_config):
        startup_profile.start("engine-init")  # to the end of graph capture, on this (the engine's) thread
        out = create(self, model, vllm_config)
        root = os.environ.get(AHEAD_ENV)
        v2 = bool(getattr(vllm_config, "use_v2_model_runner", False))
        if root and not vllm_pins and not v2:
            read, pin_read = _reader(self, load, unpinned, lambda model: _outside(capturing, pin, model), LoRARequest)
            capacity = self._adapter_manager.capacity
            loop = lambda: _read_ahead(store, root, capacity, read, _on_device(self), pin_read)  # noqa: E731
            (start or _daemon)(loop)
        elif root:
            why = (
                "vLLM's V2 model runner captures CUDA graphs out of the lock's reach" if v2 else "vLLM pins as it reads"
            )
            log.warning("moelora: not reading %s ahead: %s (CUDA off the engine thread)", root, why)
        return out

    def capture_model(self):
        with capturing:
            startup_profile.start("graph-capture")  # with MOELORA_PROFILE_STARTUP_FROM=graph-capture
            try:
                return capture(self)
            finally:
                startup_profile.stop()

    def profile_cudagraph_memory(self):
        with capturing:
            startup_profile.start("graph-capture")
            return profile_graphs(self)

    _load_adapter.__qualname__ = "moelora_load_adapter"
    patches.set(runner_cls, "capture_model", capture_model)
    patches.set(runner_cls, "profile_cudagraph_memory", profile_cudagraph_memory)
    patches.set(worker_cls, "_load_adapter", _load_adapter)
    patches.set(manager_cls, "_create_merged_loras_inplace", _create_merged_loras_inplace)
    patches.set(lru_cls, "create_lora_manager", create_lora_manager)
    return None


def _outside(capturing: Any, pin: Callable[[Any], None], model: Any) -> None:
    with capturing:
        pin(model)


def _on_device(worker: Any) -> Callable[[], None]:
    """The reader thread's CUDA calls go to the engine's GPU (a new thread starts on device 0)."""
    device = getattr(worker, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        return lambda: torch.cuda.set_device(device)
    return lambda: None


def _reader(
    worker: Any, load: Callable, merge: Callable, pin: Callable, request_cls: type
) -> tuple[Callable[[str], Any], Callable[[Any, str, float], Any]]:
    """Read and merge the adapter at a path as the engine would (vLLM's own read and merge, with a placeholder id that
    each load's clone replaces), and pin what was read (the plugin's pinning, outside capture): the reader's and
    the pinning thread's steps."""

    def read(path: str) -> Any:
        t0 = time.monotonic()
        model = load(worker, request_cls(lora_name=os.path.basename(path), lora_int_id=1, lora_path=path))
        merge(worker._adapter_manager, model)
        setattr(model, MERGED, True)
        log.info("moelora: read %s ahead in %.2f s", path, time.monotonic() - t0)
        return model

    def pin_read(model: Any, path: str, read_at: float) -> Any:
        pin(model)  # waits out a capture phase first; the pin's own time is in adapter_pinning's line
        log.info("moelora: pinned %s %.2f s after its read", path, time.monotonic() - read_at)
        return model

    return read, pin_read


def _daemon(loop: Callable[[], None]) -> None:
    threading.Thread(target=loop, name="moelora-adapters-ahead-scan", daemon=True).start()
