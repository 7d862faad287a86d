"""The emulator's event log: every change in order, so that a watch resumes where the client's list left off.

kmock's own watch streams "everything now, then live" and forgets what happened in between, but clients (kopf,
kubectl) list first and then watch from the list's resourceVersion, so an event between the two would be lost.
Here every change is appended to a log; a list marks its position in it, and a watch resumes right there.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import AsyncIterator, Iterator
from typing import Any

LIMIT = 20000  # entries kept; past that the oldest half is forgotten and watches from there get 410 Expired


class Expired(Exception):
    """The log no longer reaches back to where a watch wants to resume (a client then relists)."""


class WatchLog:
    """(resource, watch event) entries in the order they happened; positions count from the first entry ever."""

    def __init__(self, *, versions: Iterator[int], limit: int = LIMIT) -> None:
        self._versions = versions  # the emulator's resourceVersion counter, shared
        self._limit = limit
        self._entries: list[tuple[Any, dict[str, Any]]] = []
        self._base = 0  # the position of _entries[0]
        self._marks: dict[int, int] = {}  # resourceVersion of a list -> the log's end at that moment
        self._changed = asyncio.Condition()

    @property
    def end(self) -> int:
        return self._base + len(self._entries)

    def mark(self, version: int) -> None:
        """Remember that a list answered with `version` saw everything up to the current end."""
        self._marks[version] = self.end

    async def record(self, resource: Any, event: dict[str, Any]) -> None:
        """Append an event and wake the watches."""
        if event.get("type") == "DELETED":  # a deletion is a change of its own, with its own resourceVersion
            obj = copy.deepcopy(event["object"])
            obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
            event = {"type": "DELETED", "object": obj}
        self._entries.append((resource, event))
        if len(self._entries) > self._limit:  # forget the oldest half: watches from there get 410 Expired, and relist
            drop = len(self._entries) // 2
            del self._entries[:drop]
            self._base += drop
            self._marks = {rv: pos for rv, pos in self._marks.items() if pos >= self._base}
        async with self._changed:
            self._changed.notify_all()

    def position_after(self, resource_version: int) -> int | None:
        """Where a watch from this resourceVersion resumes; None if the log no longer reaches back that far."""
        if resource_version in self._marks:
            return self._marks[resource_version]
        for index in range(len(self._entries) - 1, -1, -1):
            rv = _version_of(self._entries[index][1])
            if rv == resource_version:
                return self._base + index + 1
            if rv < resource_version:
                break
        oldest = _version_of(self._entries[0][1]) if self._entries else 0
        return None if resource_version < oldest else self.end

    async def follow(self, position: int, *, deadline: float | None) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
        """The entries from `position` on, as they are recorded, until the loop time `deadline` (None: forever).

        Raises Expired if the log was trimmed past the reader before it caught up.
        """
        loop = asyncio.get_running_loop()
        while True:
            async with self._changed:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(functools.partial(self._moved_past, position)), timeout=remaining
                    )
                except TimeoutError:
                    return
                if position < self._base:
                    raise Expired("the watch fell too far behind")
                entries = self._entries[position - self._base :]
                position = self.end
            for entry in entries:
                yield entry

    def _moved_past(self, position: int) -> bool:
        return self.end > position


def _version_of(event: dict[str, Any]) -> int:
    return int(event["object"].get("metadata", {}).get("resourceVersion") or 0)


class RecordingBus:
    """Stands in for kmock's per-resource event bus: every event goes to the log instead."""

    def __init__(self, log: WatchLog, resource: Any) -> None:
        self._log, self._resource = log, resource

    async def put(self, event: dict[str, Any]) -> None:
        await self._log.record(self._resource, event)


class RecordingBuses(dict):  # type: ignore[type-arg]
    """kmock's resource -> bus mapping, making a RecordingBus for each resource on first use."""

    def __init__(self, log: WatchLog) -> None:
        super().__init__()
        self._log = log

    def __missing__(self, resource: Any) -> RecordingBus:
        bus = self[resource] = RecordingBus(self._log, resource)
        return bus
