"""host_adapters: adapters merged at load, the last load kept for a reload of its files, others read ahead.

The adapters are make_qwen3's PEFT layout at a small shape. The worker's read is the installed vLLM's
`LoRAModel.from_local_checkpoint` (a stand-in for `_load_adapter`, which needs a whole model, counts the reads), and
the merge is its manager's own `_create_merged_loras_inplace` (on a manager with nothing to pack, it folds each
module's scaling into lora_b: a second merge of one adapter would fold it twice).
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import sys
import threading
import time
import types

import pytest
import torch

from moelora.vllm_plugin import adapter_pinning, host_adapters
from moelora.vllm_plugin.patches import Patches

from .test_adapter_pinning import RANK, SMALL, load, make_qwen3, plain, tensors


@pytest.fixture
def adapters(tmp_path) -> pathlib.Path:
    make_qwen3.write_loras(tmp_path, 2, RANK, config=SMALL)
    return tmp_path


class Installed:
    """The part installed over a stand-in read (which counts its calls by path) on a worker whose manager has nothing
    to pack, as on CUDA: vLLM's pinning passes off and the plugin's pinning into one (plain) buffer."""

    def __init__(
        self, monkeypatch, *, pinning: bool = True, ahead: str | None = None, capture: str = "", vllm_config=None
    ) -> None:
        import vllm.lora.lora_model as lora_model_module
        import vllm.lora.model_manager as manager_module
        import vllm.lora.worker_manager as worker_module
        import vllm.v1.worker.gpu_model_runner as runner_module

        self.reads: list[str] = []
        self.threads: list[threading.Thread] = []
        part = self

        def read(self, lora_request):  # vLLM's signature, as the part checks it
            part.reads.append(lora_request.lora_path)
            model = load(pathlib.Path(lora_request.lora_path))
            model.id = lora_request.lora_int_id
            return model

        def create(self, model, vllm_config):
            self._adapter_manager = part.manager
            return model

        vllms_merge = manager_module.LoRAModelManager._create_merged_loras_inplace
        self.merges = 0

        def merge(self, lora_model):
            part.merges += 1
            vllms_merge(self, lora_model)

        monkeypatch.setattr(manager_module.LoRAModelManager, "_create_merged_loras_inplace", merge)
        self.capturing, self.captured = threading.Event(), threading.Event()

        def capture_model(self):  # vLLM's two capture phases, standing in: a capture until the test lets it end
            part.capturing.set()
            part.captured.wait(30)
            return 0

        monkeypatch.setattr(runner_module.GPUModelRunner, "capture_model", capture_model)
        monkeypatch.setattr(runner_module.GPUModelRunner, "profile_cudagraph_memory", capture_model)
        monkeypatch.setattr(worker_module.WorkerLoRAManager, "_load_adapter", read)
        monkeypatch.setattr(worker_module.LRUCacheWorkerLoRAManager, "create_lora_manager", create)
        monkeypatch.setattr(manager_module, "PIN_MEMORY", True)
        monkeypatch.setattr(lora_model_module, "PIN_MEMORY", True)
        if ahead is None:
            monkeypatch.delenv(host_adapters.AHEAD_ENV, raising=False)
        else:
            monkeypatch.setenv(host_adapters.AHEAD_ENV, ahead)
        self.patches = Patches()
        # The plugin's buffers count as pinned, as the pinned allocator's are on CUDA.
        buffers: set[int] = set()

        def allocate(nbytes: int) -> torch.Tensor:
            buffer = plain(nbytes)
            buffers.add(buffer.untyped_storage().data_ptr())
            return buffer

        monkeypatch.setattr(adapter_pinning, "_pinned_already", lambda t: t.untyped_storage().data_ptr() in buffers)
        if pinning:
            assert adapter_pinning.install_adapter_pinning(self.patches, allocate=allocate) is None
        assert host_adapters.install_host_adapters(self.patches, start=self._start) is None
        self.manager = object.__new__(manager_module.LRUCacheLoRAModelManager)
        self.manager.packed_modules, self.manager.modules = {}, {}
        self.manager.lora_config = types.SimpleNamespace(max_cpu_loras=4)
        self.worker = object.__new__(worker_module.LRUCacheWorkerLoRAManager)
        if capture:  # the engine thread is in this capture phase when the read-ahead starts
            self._start(lambda: getattr(runner_module.GPUModelRunner, capture)(object()))
            assert self.capturing.wait(30)
        self.worker.create_lora_manager("model", vllm_config)

    def _start(self, loop) -> None:
        self.threads.append(threading.Thread(target=loop, daemon=True))
        self.threads[-1].start()

    def add(self, path: pathlib.Path, lora_id: int, name: str = "a"):
        """What vLLM's worker does with a load request: read (the part's _load_adapter), then the manager's merge."""
        from vllm.lora.request import LoRARequest

        model = self.worker._load_adapter(LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=str(path)))
        self.manager._create_merged_loras_inplace(model)
        return model


def folded(path: pathlib.Path) -> dict:
    """vLLM's values for the adapter: read, each scaling folded into lora_b once."""
    model = load(path)
    for weights in model.loras.values():
        weights.lora_b = weights.lora_b * weights.scaling
    return {k: t for k, t in tensors(model).items()}


def same_values(model, expected: dict) -> bool:
    got = tensors(model)
    return set(got) == set(expected) and all(torch.equal(got[k], expected[k].to(got[k].dtype)) for k in expected)


def test_loading_the_same_files_again_reads_them_once_and_merges_once(adapters, monkeypatch, plugin_log):
    part = Installed(monkeypatch)
    try:
        path = adapters / "lora1"
        first = part.add(path, 11, "moelora-canary-1")
        second = part.add(path, 12, "adapter-1")
        assert part.reads == [str(path)] and part.merges == 1
        assert (first.id, second.id) == (11, 12) and second is not first
        assert same_values(first, folded(path)) and same_values(second, folded(path))  # folded once, not twice
        one = {t.untyped_storage().data_ptr() for t in tensors(first).values()}
        assert {t.untyped_storage().data_ptr() for t in tensors(second).values()} == one and len(one) == 1
        assert any("adapter 12 (adapter-1) from its last load" in line for line in plugin_log)
        part.add(adapters / "lora2", 13)
        part.add(path, 14)  # no longer the last load: read again
        assert part.reads == [str(path), str(adapters / "lora2"), str(path)]
    finally:
        part.patches.undo()


def test_files_changed_since_are_read_again(adapters, monkeypatch):
    part = Installed(monkeypatch)
    try:
        path = adapters / "lora1"
        part.add(path, 11)
        weights = path / "adapter_model.safetensors"
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
        part.add(path, 12)
        assert part.reads == [str(path), str(path)]
    finally:
        part.patches.undo()


def test_adapters_under_the_directory_are_read_ahead_and_the_load_takes_them(adapters, monkeypatch, plugin_log):
    monkeypatch.setattr(host_adapters, "POLL_S", 0.01)
    monkeypatch.setattr(host_adapters, "KEEP_S", 0.2)
    (adapters / ".part-x").mkdir()  # the agent's partial download: not an adapter yet
    part = Installed(monkeypatch, ahead=str(adapters))
    try:
        deadline = time.monotonic() + 30
        while len([line for line in plugin_log if "after its read" in line]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # both read, merged and pinned
        assert sorted(part.reads) == sorted(str(adapters / n) for n in ("lora1", "lora2"))
        model = part.add(adapters / "lora2", 21, "adapter-2")
        assert len(part.reads) == 2 and part.merges == 2  # taken from the copy read ahead, not read again
        assert model.id == 21 and same_values(model, folded(adapters / "lora2"))
        assert len({t.untyped_storage().data_ptr() for t in tensors(model).values()}) == 1  # pinned when taken
        assert any("adapter 21 (adapter-2) from the copy read ahead" in line for line in plugin_log)
        part.threads[0].join(timeout=30)
        assert any("dropped 1 adapter(s) read ahead and not loaded" in line for line in plugin_log)
        part.add(adapters / "lora1", 22)
        assert len(part.reads) == 3
    finally:
        part.patches.undo()


def test_nothing_is_read_ahead_where_vllm_pins_as_it_reads(adapters, monkeypatch, plugin_log):
    part = Installed(monkeypatch, pinning=False, ahead=str(adapters))
    try:
        assert part.threads == []
        assert any("not reading" in line and "ahead" in line for line in plugin_log)
    finally:
        part.patches.undo()


def test_nothing_is_read_ahead_under_vllms_v2_model_runner(adapters, monkeypatch, plugin_log):
    """V2 captures CUDA graphs in methods of its own, where the capture lock does not reach: a pin from the reader
    could land inside one."""
    part = Installed(monkeypatch, ahead=str(adapters), vllm_config=types.SimpleNamespace(use_v2_model_runner=True))
    try:
        assert part.threads == [] and part.reads == []
        assert any("not reading" in line and "V2 model runner" in line for line in plugin_log)
    finally:
        part.patches.undo()


def test_a_failed_read_ahead_leaves_the_load_to_vllm(adapters, monkeypatch, plugin_log):
    store = host_adapters.HostAdapters()
    key = host_adapters.identity(str(adapters / "lora1"), False)
    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.set_exception(ValueError("bad tensor"))
    store.ahead(key, failed)
    assert store.take(key) is None
    assert any("reading" in line and "bad tensor" in line for line in plugin_log)
    pending: concurrent.futures.Future = concurrent.futures.Future()
    store.ahead(key, pending)
    assert store.take(key) is None and pending.cancelled()  # not started: the engine thread reads it itself


def test_identity_and_the_directories_it_looks_at(adapters):
    one = host_adapters.identity(str(adapters / "lora1"), False)
    assert one == host_adapters.identity(str(adapters / "lora1"), False)
    assert one != host_adapters.identity(str(adapters / "lora1"), True)
    assert one != host_adapters.identity(str(adapters / "lora2"), False)
    assert host_adapters.identity(str(adapters / "missing"), False) is None
    (adapters / "empty").mkdir()
    (adapters / ".tmp-1").mkdir()
    (adapters / ".tmp-1" / host_adapters.CONFIG).write_text("{}")
    config = adapters / "lora1" / host_adapters.CONFIG  # make_qwen3 hard-links lora2's files to lora1's
    text = config.read_text()
    config.unlink()
    config.write_text(text)
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert host_adapters.adapter_dirs(str(adapters)) == [str(adapters / "lora1"), str(adapters / "lora2")]


def test_install_is_skipped_when_switched_off(monkeypatch):
    monkeypatch.setenv(host_adapters.ENV, "0")
    patches = Patches()
    assert host_adapters.install_host_adapters(patches) == f"{host_adapters.ENV}=0"
    assert patches.done == []


def test_read_ahead_stops_at_the_managers_capacity_newest_first(adapters, monkeypatch, plugin_log):
    monkeypatch.setattr(host_adapters, "POLL_S", 0.01)
    monkeypatch.setattr(host_adapters, "KEEP_S", 0.0)
    newer = adapters / "lora2" / host_adapters.CONFIG
    text = newer.read_text()
    newer.unlink()
    newer.write_text(text)
    os.utime(newer, ns=(newer.stat().st_atime_ns, newer.stat().st_mtime_ns + 10**9))
    store, read = host_adapters.HostAdapters(), []
    loop = threading.Thread(target=host_adapters._read_ahead, args=(store, str(adapters), 1, read.append, lambda: None))
    loop.start()
    deadline = time.monotonic() + 30
    while not read and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # a second adapter would be submitted by now
    store.loading.set()
    loop.join(timeout=30)
    assert read == [str(adapters / "lora2")]
    assert any("dropped 1 adapter(s)" in line for line in plugin_log)


@pytest.mark.parametrize("phase", ["capture_model", "profile_cudagraph_memory"])
def test_adapters_read_ahead_are_pinned_only_outside_cuda_graph_capture(adapters, monkeypatch, plugin_log, phase):
    """Both phases capture graphs (vLLM 0.26's worker measures graph memory with captures before its KV cache); a pin
    during either invalidated that capture and failed a GPT-OSS pod's start on an H100."""
    monkeypatch.setattr(host_adapters, "POLL_S", 0.01)
    part = Installed(monkeypatch, ahead=str(adapters), capture=phase)
    try:
        deadline = time.monotonic() + 30
        # The reader goes on while the first adapter's pin waits for the capture to end: both are read meanwhile.
        while len([line for line in plugin_log if "ahead in" in line]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # a pin would have run by now
        assert sorted(part.reads) == sorted(str(adapters / n) for n in ("lora1", "lora2"))
        assert not any("pinned" in line for line in plugin_log) and part.capturing.is_set()
        part.captured.set()
        while len([line for line in plugin_log if "after its read" in line]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len([line for line in plugin_log if "after its read" in line]) == 2
        assert len([line for line in plugin_log if "pinned in one buffer" in line]) == 2
        model = part.add(adapters / "lora1", 31)
        assert len({t.untyped_storage().data_ptr() for t in tensors(model).values()}) == 1
        assert len([line for line in plugin_log if "pinned in one buffer" in line]) == 2  # not pinned again
    finally:
        part.captured.set()
        part.patches.undo()


def test_the_switch_interval_is_short_while_reads_run_and_restored_after(adapters, monkeypatch):
    monkeypatch.setattr(host_adapters, "POLL_S", 0.01)
    monkeypatch.setattr(host_adapters, "KEEP_S", 0.0)
    before = sys.getswitchinterval()
    assert before > host_adapters.SWITCH_S  # the interpreter's default, 5 ms
    seen: list[float] = []
    started, finish = threading.Event(), threading.Event()

    def read(path: str) -> str:
        started.set()
        finish.wait(30)
        seen.append(sys.getswitchinterval())
        return path

    store = host_adapters.HostAdapters()
    loop = threading.Thread(target=host_adapters._read_ahead, args=(store, str(adapters), 1, read, lambda: None))
    loop.start()
    assert started.wait(30)
    assert sys.getswitchinterval() == host_adapters.SWITCH_S
    finish.set()
    store.loading.set()  # the first load: the loop goes on to drop what was not taken
    loop.join(timeout=30)
    # The reader thread restores the interval after read returns; the loop does not wait for that thread.
    deadline = time.monotonic() + 30
    while sys.getswitchinterval() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [host_adapters.SWITCH_S] and sys.getswitchinterval() == before


def test_overlapping_reads_restore_the_interval_that_was_there_before_the_first(monkeypatch):
    before = sys.getswitchinterval()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    during: list[float] = []

    def first(path: str) -> None:
        first_in.set()
        assert second_in.wait(30)

    def second(path: str) -> None:
        second_in.set()
        assert first_out.wait(30)  # the first read has ended: its manager's loop would have restored here
        during.append(sys.getswitchinterval())

    a = threading.Thread(target=host_adapters._short_switch, args=(first, "a"))
    b = threading.Thread(target=lambda: (first_in.wait(30), host_adapters._short_switch(second, "b")))
    a.start()
    b.start()
    a.join(timeout=30)
    first_out.set()
    b.join(timeout=30)
    assert during == [host_adapters.SWITCH_S] and sys.getswitchinterval() == before


def test_a_copy_waiting_for_its_pin_is_taken_once_pinned_and_dropped_unpinned():
    """The store's future for a copy read ahead resolves to its pin's future: a load waits for the pin, and a copy
    dropped before its pin ran is never pinned."""
    key = lambda name: (name, (), False)  # noqa: E731
    store = host_adapters.HostAdapters()
    read_a, pin_a, read_b, pin_b = (concurrent.futures.Future() for _ in range(4))
    for future, result in ((read_a, pin_a), (read_b, pin_b)):
        future.set_running_or_notify_cancel()
        future.set_result(result)
    store.ahead(key("a"), read_a)
    store.ahead(key("b"), read_b)
    pin_a.set_running_or_notify_cancel()
    taker = concurrent.futures.ThreadPoolExecutor(1).submit(store.take, key("a"))
    time.sleep(0.1)
    assert not taker.done()  # read, not pinned yet
    pin_a.set_result("model a")
    assert taker.result(timeout=30) == ("model a", "the copy read ahead")
    assert store.drop_ahead() == 1 and pin_b.cancelled()
