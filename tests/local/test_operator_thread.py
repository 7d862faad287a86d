"""The operator thread's diagnostic for a stop that hangs: what its loop is still running, and where."""

from __future__ import annotations

import asyncio
import threading

from moelora.local.operator_thread import OperatorThread


def test_pending_names_each_unfinished_task_and_where_it_waits() -> None:
    operator = OperatorThread(settings=type("Settings", (), {"namespaces": ()})())
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def stuck_in_a_watch() -> None:
        started.set()
        await asyncio.sleep(3600)

    operator._loop = loop  # what _run sets; the thread itself never started here
    task = loop.create_task(stuck_in_a_watch(), name="watcher of modelservers")
    runner = threading.Thread(target=lambda: loop.run_until_complete(asyncio.wait([task], timeout=10)))
    runner.start()
    try:
        assert started.wait(5)
        report = operator.pending()
        assert "watcher of modelservers" in report and "stuck_in_a_watch" in report
    finally:
        loop.call_soon_threadsafe(task.cancel)
        runner.join(10)
        loop.close()
    assert "(no running loop)" in operator.pending()
