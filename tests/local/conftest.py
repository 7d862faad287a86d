"""Fixtures for the local stack's own tests: one tiny model and two adapters per session (a few seconds), and a
look at /proc that does not use the code under test."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest

from moelora.local import models

BASE_MODEL_NAME = "moelora/tiny-llama"


@pytest.fixture(scope="session")
def tiny(tiny_llama: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """tests/conftest.py's tiny Llama (the one its shared vLLM serves) and two adapters made for it."""
    root, model = tmp_path_factory.mktemp("tiny"), tiny_llama
    return {
        "model": model,
        "a1": models.make_adapter(model_dir=model, path=root / "a1", base_model_name=BASE_MODEL_NAME, rank=8, seed=1),
        "a2": models.make_adapter(model_dir=model, path=root / "a2", base_model_name=BASE_MODEL_NAME, rank=4, seed=2),
    }


def _running_in(sid: int) -> list[int]:
    """Processes whose session or process group is `sid` and that still run (a zombie has exited), from /proc."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_bytes()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and ")".
        fields = stat[stat.rindex(b")") + 2 :].split()
        if sid in (int(fields[2]), int(fields[3])) and fields[0] not in (b"Z", b"X"):
            found.append(int(proc.name))
    return found


@pytest.fixture
def running_in() -> Callable[[int], list[int]]:
    """`running_in(sid)`: the pids of the session (or process group) `sid` that have not exited."""
    return _running_in
