from __future__ import annotations

import pytest

from moelora.operator.settings import DEFAULT_SERVER_IMAGE, MAX_DRAIN_DELAY_SECONDS, Settings


def test_defaults_from_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings.server_image == settings.agent_image == DEFAULT_SERVER_IMAGE
    assert settings.server_service_account == "moelora-server"
    assert settings.namespaces == () and settings.peering is None and settings.liveness_endpoint is None
    assert settings.drain_delay_seconds == 5


def test_every_variable() -> None:
    settings = Settings.from_env(
        {
            "MOELORA_SERVER_IMAGE": "s:1",
            "MOELORA_AGENT_IMAGE": "a:1",
            "MOELORA_SERVER_SERVICE_ACCOUNT": "sa",
            "MOELORA_NAMESPACES": " team-a, ,team-b ",
            "MOELORA_PEERING": "moelora",
            "MOELORA_RESYNC_SECONDS": "5",
            "MOELORA_DRAIN_DELAY_SECONDS": "0",
            "MOELORA_KERNEL_CONFIGS_DIR": "/etc/configs",
            "MOELORA_PEERING_PRIORITY": "7",
            "MOELORA_LIVENESS_ENDPOINT": "http://0.0.0.0:8080/healthz",
        }
    )
    assert settings.peering_priority == 7
    assert settings.liveness_endpoint == "http://0.0.0.0:8080/healthz"
    assert settings.kernel_configs_dir == "/etc/configs"
    assert (settings.server_image, settings.agent_image, settings.server_service_account) == ("s:1", "a:1", "sa")
    assert settings.namespaces == ("team-a", "team-b")
    assert settings.peering == "moelora" and settings.resync_seconds == 5.0
    assert settings.drain_delay_seconds == 0


def test_agent_image_follows_the_server_image() -> None:
    assert Settings.from_env({"MOELORA_SERVER_IMAGE": "s:2"}).agent_image == "s:2"


def test_bad_priority_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="MOELORA_PEERING_PRIORITY"):
        Settings.from_env({"MOELORA_PEERING_PRIORITY": "high"})


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_bad_resync_is_a_clear_error(value: str) -> None:
    with pytest.raises(ValueError, match="MOELORA_RESYNC_SECONDS"):
        Settings.from_env({"MOELORA_RESYNC_SECONDS": value})


@pytest.mark.parametrize("value", ["soon", "2.5", "-1", str(MAX_DRAIN_DELAY_SECONDS + 1)])
def test_bad_drain_delay_is_a_clear_error(value: str) -> None:
    with pytest.raises(ValueError, match="MOELORA_DRAIN_DELAY_SECONDS"):
        Settings.from_env({"MOELORA_DRAIN_DELAY_SECONDS": value})


@pytest.mark.parametrize("value", ["0.0.0.0:8080", "https://0.0.0.0:8080/healthz", "http://0.0.0.0/healthz"])
def test_bad_liveness_endpoint_is_a_clear_error(value: str) -> None:
    with pytest.raises(ValueError, match="MOELORA_LIVENESS_ENDPOINT"):
        Settings.from_env({"MOELORA_LIVENESS_ENDPOINT": value})
