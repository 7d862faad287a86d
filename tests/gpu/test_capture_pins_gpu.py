"""What host_adapters' capture lock is for, on a real GPU: CUDA refuses a pinned host allocation from another thread
while a graph is captured in torch's (and vLLM's) default global mode, and the capture fails; the read-ahead's pin,
taken under the lock the capture phases hold, waits and the capture stands. Each case runs in its own process, so a
failed capture cannot leave state behind for the other tests.

Run as tests/gpu is (its own pytest process, PYTHONPATH=kernels:image, no TRITON_INTERPRET)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# One capture with a pin from a second thread in the middle of it; prints what each side saw.
_CASE = r"""
import contextlib, json, os, sys, threading, time
import torch
from moelora.vllm_plugin import host_adapters

locked = sys.argv[1] == "locked"
capturing, started, seen = threading.Lock(), threading.Event(), {}

def pin(model):
    seen["pinned"] = torch.empty(37 << 20, dtype=torch.uint8, pin_memory=True).is_pinned()  # a fresh block

def reader():
    started.wait(30)
    try:
        if locked:
            host_adapters._outside(capturing, pin, None)
        else:
            pin(None)
    except Exception as exc:
        seen["pin_error"] = type(exc).__name__
    seen["pin_done_at"] = time.monotonic()

x = torch.ones(1 << 20, device="cuda")
(x * 2 + 1).sum().item()  # the captured kernels loaded before the capture: no first launch inside it
torch.cuda.synchronize()
thread = threading.Thread(target=reader)
thread.start()
graph = torch.cuda.CUDAGraph()
try:
    with capturing if locked else contextlib.nullcontext():  # as host_adapters wraps vLLM's capture phases
        with torch.cuda.graph(graph):
            y = x * 2
            started.set()
            time.sleep(0.5)  # the reader pins now, or waits for the lock
            y = y + 1
        seen["capture_end_at"] = time.monotonic()
    graph.replay()
    torch.cuda.synchronize()
    seen["replayed"] = bool((y == 3).all())
except Exception as exc:
    seen["capture_error"] = type(exc).__name__
thread.join(30)
print(json.dumps(seen), flush=True)
os._exit(0)  # no teardown after a failed capture: what was seen is out
"""


def _run(mode: str) -> dict:
    paths = [os.path.abspath(p) for p in ("image", "kernels", "operator")] + [os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    done = subprocess.run([sys.executable, "-c", _CASE, mode], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_pin_from_another_thread_fails_the_capture():
    seen = _run("unlocked")
    assert "pin_error" in seen, seen  # CUDA refused the pinned allocation during the capture
    assert "capture_error" in seen and "replayed" not in seen, seen  # and the capture itself failed


def test_a_pin_under_the_capture_lock_waits_and_the_capture_stands():
    seen = _run("locked")
    assert seen.get("replayed") is True and seen.get("pinned") is True, seen
    assert "capture_error" not in seen and "pin_error" not in seen, seen
    assert seen["pin_done_at"] >= seen["capture_end_at"], seen
