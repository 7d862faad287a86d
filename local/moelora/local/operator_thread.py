"""The real kopf operator in a thread of its own, against any API server (the emulator, in tests and the stack).

It gets its own event loop because kopf's shutdown, run inside pytest-asyncio's loop, cancels the fixture's own
teardown tasks.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import traceback
from collections.abc import Collection
from typing import Any, Self

log = logging.getLogger("moelora.operator.thread")  # a child of the logger the stack writes to operator.log


class OperatorThread:
    """The operator (`moelora.operator.control.wiring.run`) in a thread with its own event loop.

    `with OperatorThread(settings=...):` returns once kopf is ready (its indexes filled); leaving stops it.
    """

    def __init__(self, *, settings: Any, namespaces: Collection[str] = (), registry: Any = None) -> None:
        self.settings = settings
        self.namespaces = tuple(namespaces) or tuple(settings.namespaces)
        self.registry = registry
        self._thread = threading.Thread(target=self._run, name="moelora-operator", daemon=True)
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self, *, timeout: float = 60) -> Self:
        self._thread.start()
        if not self._ready.wait(timeout=timeout):
            self.stop()
            raise TimeoutError("the operator did not become ready") from self.error
        if self.error is not None:
            raise RuntimeError("the operator failed to start") from self.error
        return self

    def stop(self, *, timeout: float = 30) -> None:
        """Set kopf's stop flag and wait for the thread; one that outlives `timeout` is left running (a daemon) and
        its loop's pending tasks are logged with their stacks, so that the hang can be told apart from a slow stop."""
        self._stop.set()
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            log.warning("the operator did not stop within %.0f s; its pending tasks:\n%s", timeout, self.pending())

    def pending(self) -> str:
        """The thread's own stack (where a blocked loop is stuck), then its loop's unfinished tasks with theirs (read
        from another thread: a snapshot)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        lines = ["  thread: " + "".join(traceback.format_stack(frame, limit=6)).strip()] if frame is not None else []
        loop = self._loop
        if loop is None or loop.is_closed():
            return "\n".join([*lines, "  (no running loop)"])
        for task in list(asyncio.all_tasks(loop)):
            frames = task.get_stack(limit=4)
            where = " <- ".join(f"{f.f_code.co_name} ({f.f_code.co_filename}:{f.f_lineno})" for f in frames)
            lines.append(f"  {task.get_name()}: {where or task.get_coro()!r}")
        return "\n".join(lines) or "(none)"

    def _run(self) -> None:
        from moelora.operator.control import wiring  # imported late: importing it registers kopf handlers

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(
                wiring.run(
                    settings=self.settings,
                    namespaces=self.namespaces,
                    registry=self.registry,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - surfaced by start()
            self.error = exc
            self._ready.set()
        finally:
            loop.close()
