"""The last good version of each adapter, remembered on the cache volume across agent restarts.

A marker `<cache>/.served/<uid>.json` names the version (and the directory vLLM loads) that this pod last loaded
for the adapter. When a new version is refused, the agent keeps serving that one instead of failing the adapter,
whether it has run all along or just restarted. The marker lives beside the files it names: the fallback is only
possible while they are on disk, and a volume that lost them lost the marker too, so the two cannot disagree (a
marker in the replica's status entry could outlive the files, and would need an API read at start).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib

logger = logging.getLogger(__name__)

DIRECTORY = ".served"


@dataclasses.dataclass(frozen=True)
class Served:
    version: str
    path: str  # the directory vLLM loads (the cache entry, or its per-expert rewrite)


class LastGood:
    def __init__(self, cache_dir: pathlib.Path) -> None:
        self.root = cache_dir / DIRECTORY

    def _file(self, uid: str) -> pathlib.Path:
        return self.root / f"{hashlib.sha256(uid.encode()).hexdigest()[:32]}.json"  # uids are not trusted names

    def remember(self, uid: str, served: Served) -> None:
        if self.get(uid) == served:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            temp = self._file(uid).with_suffix(".tmp")
            temp.write_text(json.dumps({"uid": uid, "version": served.version, "path": served.path}))
            os.replace(temp, self._file(uid))
        except OSError as error:  # losing the fallback must not stop serving
            logger.warning("could not remember the served version of %s: %s", uid, error)

    def get(self, uid: str) -> Served | None:
        """The last good version whose files are still in the cache, or None."""
        try:
            data = json.loads(self._file(uid).read_text())
            served = Served(version=str(data["version"]), path=str(data["path"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return served if data.get("uid") == uid and pathlib.Path(served.path).is_dir() else None

    def versions(self) -> set[str]:
        """Every remembered version: kept from eviction, since each is some adapter's fallback."""
        found = set()
        if self.root.is_dir():
            for path in self.root.glob("*.json"):
                try:
                    found.add(str(json.loads(path.read_text())["version"]))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
        return found

    def forget(self, uid: str) -> None:
        self._file(uid).unlink(missing_ok=True)

    def prune(self, desired: set[str]) -> None:
        """Drop the markers of adapters deleted while the agent was away (they would pin their files forever)."""
        if not self.root.is_dir():
            return
        for path in self.root.glob("*.json"):
            try:
                uid = json.loads(path.read_text())["uid"]
            except (OSError, ValueError, KeyError, TypeError):
                uid = None
            if uid not in desired:
                path.unlink(missing_ok=True)
