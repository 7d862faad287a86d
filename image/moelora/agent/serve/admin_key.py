"""The agent's per-pod key for vLLM's admin routes (moelora.vllm_plugin.admin_guard).

A fresh random key at every agent start, written where only the agent and vLLM can read it (an in-memory emptyDir);
the guard re-reads the file when it changes, so a restarted agent simply takes over with its new key.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import tempfile


def create(path: pathlib.Path) -> str:
    """Write a new random key to `path` atomically, readable by its owner only (0600), and return it."""
    key = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".key-", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(key)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)  # the guard sees the old key or the new one, never a half-written file
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise
    return key
