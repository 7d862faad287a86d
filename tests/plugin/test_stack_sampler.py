"""stack_sampler: one thread's stack, sampled from another; the other threads' work stays out of it."""

from __future__ import annotations

import sys
import threading
import time

from moelora.vllm_plugin.stack_sampler import StackSampler, name


def spin_sampled(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(200))


def spin_beside(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(200))


def waits(seconds: float) -> None:
    time.sleep(seconds)  # a C call without the GIL: counted as this function's own time


def recurse(depth: int) -> None:
    if depth:
        recurse(depth - 1)
    else:
        spin_sampled(0.2)


def functions(counter) -> dict[str, int]:
    return {function[2]: n for function, n in counter.items()}


def test_only_the_sampled_thread_is_counted_and_its_own_time_falls_on_the_top_function():
    stop = threading.Event()
    beside = threading.Thread(target=spin_beside, args=(stop,))
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # as host_adapters sets it while adapters are read ahead: the GIL changes hands often
    beside.start()
    sampler = StackSampler(threading.get_ident(), interval=0.001)
    sampler.start()
    try:
        spin_sampled(0.3)
        waits(0.2)
    finally:
        sampler.stop()
        stop.set()
        beside.join()
        sys.setswitchinterval(switch)
    cumulative, own = functions(sampler.cumulative), functions(sampler.own)
    assert sampler.samples >= 30
    assert "spin_beside" not in cumulative  # the other thread, busy all along, never appears
    assert cumulative["spin_sampled"] >= 5 and cumulative["waits"] >= 5  # shares vary with the GIL's hand-overs
    assert own["spin_sampled"] + own["waits"] > 0.8 * sampler.samples  # nothing below them ran Python of its own
    test_name = sys._getframe().f_code.co_name
    assert cumulative[test_name] >= 0.9 * sampler.samples  # the caller is on every sample's stack
    assert own.get(test_name, 0) < 0.1 * sampler.samples


def test_a_recursing_function_counts_once_a_sample():
    sampler = StackSampler(threading.get_ident(), interval=0.001)
    sampler.start()
    try:
        recurse(20)
    finally:
        sampler.stop()
    assert 0 < functions(sampler.cumulative)["recurse"] <= sampler.samples


def test_the_report_lists_both_orderings_with_shares_and_seconds():
    sampler = StackSampler(threading.get_ident(), interval=0.5)
    assert sampler.report(rows=5, seconds=1.0).startswith("0 samples over 1.00 s")  # nothing sampled: no rows
    other = sys._getframe(1)
    frame = sys._getframe()
    for _ in range(4):
        sampler.take(frame)
    sampler.take(None)  # a thread that has ended: no sample
    text = sampler.report(rows=5, seconds=2.0)
    assert text.startswith("4 samples over 2.00 s, one asked every 500 ms")
    on_stack, at_top = text.split("by samples at the top (own):")
    code = frame.f_code
    this = name((code.co_filename, code.co_firstlineno, code.co_name))
    row = f"        4 100.0%     2.00  {this}"
    assert row in on_stack and row in at_top
    sampler.take(other)  # a fifth sample, with the caller at the top: the shares and seconds follow
    assert f"        4  80.0%     1.60  {this}" in sampler.report(rows=5, seconds=2.0)
