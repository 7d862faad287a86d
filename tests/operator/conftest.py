from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from moelora.api import ModelServerSpec
from moelora.operator.settings import Settings

K8S_VERSION = "1.33.0"


def k8s_valid(obj: dict[str, Any]) -> None:
    """Raise if a built-in object is not valid for Kubernetes (strict: unknown fields fail too)."""
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.fixture
def settings() -> Settings:
    return Settings(server_image="example.com/server:1", agent_image="example.com/agent:1")


def make_spec(**overrides: Any) -> ModelServerSpec:
    wire: dict[str, Any] = {"model": {"name": "org/tiny-moe"}}
    wire.update(overrides)
    return ModelServerSpec.model_validate(wire)
