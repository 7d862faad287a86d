"""The allowlists ModelServer and LoRAAdapter authors are judged against: pure functions, no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from moelora.api import AdapterSource
from moelora.operator import policy
from moelora.operator.errors import SpecProblem
from moelora.operator.settings import Settings

SETTINGS = Settings(
    server_image="ghcr.io/moelora/moelora-server:0.1.0",
    server_service_account="moelora-server",
    allowed_images=("ghcr.io/moelora/moelora-server:*", "registry.example.com/ml/*"),
    allowed_service_accounts=("irsa-reader",),
    allowed_s3_endpoints=("https://s3.team-b.example.com",),
    allowed_s3_buckets=("team-a-*",),
)


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        (None, True),
        ("ghcr.io/moelora/moelora-server:0.2.0", True),
        ("registry.example.com/ml/vllm:1", True),
        ("ghcr.io/moelora/moelora-server-evil:1", False),
        ("docker.io/library/ubuntu", False),
    ],
)
def test_images(image: str | None, ok: bool) -> None:
    if ok:
        policy.check_image(image, SETTINGS)
    else:
        with pytest.raises(SpecProblem) as caught:
            policy.check_image(image, SETTINGS)
        assert caught.value.reason == "ImageNotAllowed"


def test_without_a_list_only_the_operators_own_image() -> None:
    settings = Settings(server_image="x/server:1")
    policy.check_image("x/server:1", settings)
    with pytest.raises(SpecProblem):
        policy.check_image("x/server:2", settings)


@pytest.mark.parametrize(
    ("name", "ok"), [(None, True), ("moelora-server", True), ("irsa-reader", True), ("default", False)]
)
def test_service_accounts(name: str | None, ok: bool) -> None:
    if ok:
        policy.check_service_account(name, SETTINGS)
    else:
        with pytest.raises(SpecProblem) as caught:
            policy.check_service_account(name, SETTINGS)
        assert caught.value.reason == "ServiceAccountNotAllowed"


def source(**wire: Any) -> AdapterSource:
    return AdapterSource.model_validate({"uri": "s3://team-a-adapters/x/", **wire})


@pytest.mark.parametrize(
    ("adapter", "server_endpoint", "words"),
    [
        (source(), None, None),
        (source(endpointUrl="http://minio.ns:9000/"), "http://MINIO.ns:9000", None),  # the server's own, normalized
        (source(uri="s3://team-b-adapters/x/"), None, "bucket 'team-b-adapters'"),
        (source(endpointUrl="http://169.254.169.254"), None, "neither the ModelServer's nor an allowed"),
        (source(endpointUrl="https://s3.team-b.example.com"), None, "name a credentialsSecret"),
        (source(endpointUrl="https://s3.team-b.example.com", credentialsSecret={"name": "b"}), None, None),
    ],
)
def test_adapter_sources(adapter: AdapterSource, server_endpoint: str | None, words: str | None) -> None:
    refusal = policy.adapter_source_problem(adapter, server_endpoint=server_endpoint, settings=SETTINGS)
    assert (refusal is None) if words is None else (words in (refusal or ""))


def test_no_bucket_list_means_any_bucket() -> None:
    assert (
        policy.adapter_source_problem(source(uri="s3://anything/"), server_endpoint=None, settings=Settings()) is None
    )


def test_settings_from_env() -> None:
    settings = Settings.from_env(
        {
            "MOELORA_ALLOWED_IMAGES": "a/*, b:1",
            "MOELORA_ALLOWED_SERVICE_ACCOUNTS": "x,y",
            "MOELORA_ALLOWED_S3_ENDPOINTS": "HTTPS://S3.Example.com:443",
            "MOELORA_ALLOWED_S3_BUCKETS": "team-*",
        }
    )
    assert settings.allowed_images == ("a/*", "b:1") and settings.allowed_service_accounts == ("x", "y")
    assert settings.allowed_s3_endpoints == ("https://s3.example.com:443",)
    assert settings.allowed_s3_buckets == ("team-*",)
    with pytest.raises(ValueError, match="MOELORA_ALLOWED_S3_ENDPOINTS"):
        Settings.from_env({"MOELORA_ALLOWED_S3_ENDPOINTS": "s3.example.com/bucket"})


def test_every_reason_has_a_troubleshooting_row() -> None:
    import pathlib

    from moelora.api import FailureReason

    reference = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "reference.md").read_text()
    table = reference[reference.index("## Troubleshooting by status reason") :]
    reasons = [r.value for r in FailureReason] + [
        "NameTaken",
        "ImageNotAllowed",
        "ServiceAccountNotAllowed",
        "SecretGrantForbidden",
    ]
    assert [reason for reason in reasons if f"`{reason}`" not in table] == []
