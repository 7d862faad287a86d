from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest

from moelora.api import ModelServerSpec
from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread
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


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    """The emulated API server, one per test module."""
    with KubeAPI() as api:
        yield api


def operator_settings(api: KubeAPI, **overrides: Any) -> Settings:
    """An operator's settings against `api`. Resyncs are an hour apart unless a test asks: what a test checks must
    follow from watch events, which a resync would hide."""
    fields: dict[str, Any] = {
        "server_image": "example.com/server:1",
        "agent_image": "example.com/agent:1",
        "kubeconfig": str(api.kubeconfig),
        "resync_seconds": 3600.0,
    }
    return Settings(**{**fields, **overrides})


@contextlib.contextmanager
def running_operator(api: KubeAPI, **overrides: Any) -> Iterator[OperatorThread]:
    """The real kopf operator in a thread against `api`, stopped on exit."""
    with OperatorThread(settings=operator_settings(api, **overrides)) as running:
        yield running
