"""The chart's `policy` values: what ModelServer and LoRAAdapter authors may pick, as the operator reads it."""

from __future__ import annotations

from typing import Any

import pytest

from moelora.operator import policy
from moelora.operator.errors import SpecProblem
from moelora.operator.settings import Settings

from .test_chart_operator import render


def operator_policy(values: dict[str, Any]) -> Settings:
    """Settings.from_env over the plain values the chart gives the operator container."""
    deployment = next(obj for obj in render(values) if obj["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return Settings.from_env({e["name"]: e["value"] for e in env if "value" in e})


def test_defaults_are_the_pinned_repository_the_charts_account_no_other_endpoint_any_bucket() -> None:
    settings = operator_policy({})
    repository = "ghcr.io/moelora/moelora-server"
    assert settings.allowed_images == (f"{repository}:*", f"{repository}@sha256:*")
    assert settings.allowed_service_accounts == settings.allowed_s3_endpoints == settings.allowed_s3_buckets == ()
    policy.check_image(f"{repository}:0.2.0-vllm0.27.0", settings)
    policy.check_image(f"{repository}@sha256:{'ab' * 32}", settings)
    for refused in (f"{repository}-evil:1", "docker.io/library/ubuntu:24.04"):
        with pytest.raises(SpecProblem, match="allowed images"):
            policy.check_image(refused, settings)
    policy.check_service_account(settings.server_service_account, settings)


def test_listed_values_reach_the_operator() -> None:
    settings = operator_policy(
        {
            "policy": {
                "allowedImages": ["registry.example.com/ml/*"],
                "allowedServiceAccounts": ["irsa"],
                "allowedS3Endpoints": ["https://minio.storage.svc:9000"],
                "allowedS3Buckets": ["team-*", "shared"],
            }
        }
    )
    assert settings.allowed_images == ("registry.example.com/ml/*",) and settings.allowed_service_accounts == ("irsa",)
    assert settings.allowed_s3_endpoints == ("https://minio.storage.svc:9000",)
    assert settings.allowed_s3_buckets == ("team-*", "shared")
