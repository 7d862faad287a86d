"""The adapter cache on disk: `<root>/<version>/` directories, least recently used evicted beyond a byte budget.

Use is recorded as the directory's mtime (touched whenever an adapter is loaded or found in the cache), so the
order survives an agent restart. Directories vLLM has loaded are never evicted: vLLM re-reads an adapter's files
when it falls out of its own CPU cache. Partial downloads (`.part-<version>`, kept for resuming) count too, and go
first when room is needed, unless a download is working on them; one whose adapter is no longer desired (deleted,
perhaps while the agent was down) goes at once, as its manifest names that adapter. The cache never counts on more
than its disk has: a disk smaller than the limit (or shared with other files) bounds it instead.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import shutil
import time
from collections.abc import Collection, Iterable

from moelora.agent.check.validate import directory_bytes
from moelora.agent.store import transfer
from moelora.agent.store.fetch import PARTIAL_PREFIX, TEMP_PREFIX

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Entry:
    version: str
    path: pathlib.Path
    size: int
    used: float  # mtime: last use


class AdapterCache:
    def __init__(self, *, root: pathlib.Path, limit_bytes: int) -> None:
        self.root = root
        self.limit_bytes = limit_bytes

    def entries(self) -> list[Entry]:
        """Complete adapter directories, least recently used first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            if path.name.startswith(".") or not path.is_dir():
                continue
            try:
                found.append(Entry(version=path.name, path=path, size=directory_bytes(path), used=path.stat().st_mtime))
            except FileNotFoundError:  # evicted meanwhile
                continue
        return sorted(found, key=lambda e: (e.used, e.version))

    def partials(self) -> list[Entry]:
        """Partial downloads kept for resuming, least recently changed first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            if path.name.startswith(PARTIAL_PREFIX) and path.is_dir():
                try:
                    used = path.stat().st_mtime
                    found.append(Entry(path.name.removeprefix(PARTIAL_PREFIX), path, directory_bytes(path), used))
                except FileNotFoundError:
                    continue
        return sorted(found, key=lambda e: (e.used, e.version))

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries()) + sum(e.size for e in self.partials())

    def used_bytes(self, *, reserved: Collection[str] = ()) -> int:
        """Bytes on disk, without the partials of `reserved` versions (their reservations count for them)."""
        return sum(e.size for e in self.entries()) + sum(e.size for e in self.partials() if e.version not in reserved)

    def budget(self) -> int:
        """Bytes the cache may hold now: its limit, or what it holds plus its disk's free space when that is less."""
        self.root.mkdir(parents=True, exist_ok=True)  # its filesystem is the one asked
        disk = os.statvfs(self.root)
        return min(self.limit_bytes, self.total_bytes() + disk.f_bavail * disk.f_frsize)

    def touch(self, version: str) -> None:
        path = self.root / version
        if path.is_dir():
            now = time.time()
            os.utime(path, (now, now))

    def remove_temporaries(self) -> None:
        """Partial downloads of a previous run (a crash mid-download) are garbage: nothing names them."""
        if self.root.is_dir():
            for path in self.root.iterdir():
                if path.name.startswith(TEMP_PREFIX):
                    shutil.rmtree(path, ignore_errors=True)

    def prune_partials(self, *, owners: Collection[str], busy: Collection[str]) -> list[str]:
        """Remove the partial downloads no desired adapter will resume: those whose manifest names an adapter not in
        `owners` (uids), or none; a version in `busy` (a download working on it) stays. Returns the removed versions."""
        removed = []
        for entry in self.partials():
            if entry.version not in busy and transfer.owner(entry.path) not in owners:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.version)
        return removed

    def evict(
        self, *, keep: Iterable[str], room_for: int = 0, reserved: Collection[str] = (), limit: int | None = None
    ) -> list[str]:
        """Remove partials, then least recently used entries, not in `keep` until the cache plus `room_for` fits
        `limit` (default: the cache's limit); the partials of `reserved` versions are neither counted nor removed
        (in flight).

        Returns the evicted versions (oldest first). Stops short when only kept entries remain.
        """
        limit = self.limit_bytes if limit is None else limit
        kept = set(keep) | set(reserved)
        partials = [e for e in self.partials() if e.version not in reserved]
        entries = self.entries()
        total = sum(e.size for e in entries) + sum(e.size for e in partials)
        evicted = []
        for entry in partials + entries:
            if total + room_for <= limit:
                break
            if entry.version in kept:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            total -= entry.size
            evicted.append(entry.version)
        if total + room_for > limit:
            logger.warning(
                "adapter cache holds %d bytes of loaded adapters (+%d wanted), over its room of %d",
                total,
                room_for,
                limit,
            )
        return evicted
