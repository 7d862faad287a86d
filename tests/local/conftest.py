"""Fixtures for the local stack's own tests: one tiny model and two adapters per session (a few seconds)."""

from __future__ import annotations

import pathlib

import pytest

from moelora.local import models

BASE_MODEL_NAME = "moelora/tiny-llama"


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("tiny")
    model = models.make_model(path=root / "model")
    return {
        "model": model,
        "a1": models.make_adapter(model_dir=model, path=root / "a1", base_model_name=BASE_MODEL_NAME, rank=8, seed=1),
        "a2": models.make_adapter(model_dir=model, path=root / "a2", base_model_name=BASE_MODEL_NAME, rank=4, seed=2),
    }
