import pathlib
import re

import pytest

from moelora.agent.settings import SettingsError, from_env

ENV = {
    "MOELORA_NAMESPACE": "ns",
    "MOELORA_POD_NAME": "srv-abc",
    "MOELORA_MODEL_SERVER": "srv",
    "MOELORA_BASE_MODEL": "org/model",
    "MOELORA_MAX_LORA_RANK": "16",
    "MOELORA_TARGET_MODULES": "q_proj, v_proj,",
    "MOELORA_VLLM_URL": "http://127.0.0.1:8000/",
    "MOELORA_CACHE_DIR": "/tmp/cache",
    "MOELORA_CACHE_BYTES": "1048576",
    "MOELORA_PORT": "8081",
}


def test_reads_every_documented_variable() -> None:
    settings = from_env(ENV)
    assert settings.namespace == "ns" and settings.pod_name == "srv-abc" and settings.model_server == "srv"
    assert settings.base_model == "org/model" and settings.max_lora_rank == 16
    assert settings.target_modules == {"q_proj", "v_proj"}
    assert settings.vllm_url == "http://127.0.0.1:8000"
    assert settings.cache_dir == pathlib.Path("/tmp/cache") and settings.cache_bytes == 1048576
    assert settings.port == 8081


def test_empty_target_modules_means_any() -> None:
    assert from_env({**ENV, "MOELORA_TARGET_MODULES": ""}).target_modules == frozenset()


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("MOELORA_NAMESPACE", "", "MOELORA_NAMESPACE is required"),
        ("MOELORA_MAX_LORA_RANK", "sixteen", "MOELORA_MAX_LORA_RANK must be an integer"),
        ("MOELORA_MAX_LORA_RANK", "0", "MOELORA_MAX_LORA_RANK must be at least 1"),
        ("MOELORA_CACHE_BYTES", "20Gi", "MOELORA_CACHE_BYTES must be an integer"),
        ("MOELORA_VLLM_URL", "127.0.0.1:8000", "MOELORA_VLLM_URL must be an http(s) URL"),
    ],
)
def test_bad_environment_names_the_variable(name: str, value: str, words: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(words)):
        from_env({**ENV, name: value})


def test_s3_policy_comes_from_the_operator() -> None:
    settings = from_env(
        {
            **ENV,
            "AWS_ENDPOINT_URL_S3": "http://minio:9000",
            "MOELORA_ALLOWED_S3_ENDPOINTS": "https://a.example.com, https://b.example.com",
            "MOELORA_ALLOWED_S3_BUCKETS": "team-*",
        }
    )
    assert settings.server_s3_endpoint == "http://minio:9000"
    assert settings.allowed_s3_endpoints == ("https://a.example.com", "https://b.example.com")
    assert settings.allowed_s3_buckets == ("team-*",)
    assert from_env(ENV).allowed_s3_endpoints == () and from_env(ENV).server_s3_endpoint is None


def test_fault_limits_have_defaults_and_read_their_variables() -> None:
    default = from_env(ENV)
    assert (default.list_timeout_seconds, default.download_timeout_seconds, default.ready_wait_seconds) == (
        60,
        1800,
        25,
    )
    assert (default.min_bytes_per_second, default.rate_window_seconds, default.endpoint_workers) == (65536, 30, 4)
    assert default.s3_read_timeout_seconds == 20
    tuned = from_env(
        {
            **ENV,
            "MOELORA_LIST_TIMEOUT_SECONDS": "5",
            "MOELORA_DOWNLOAD_TIMEOUT_SECONDS": "120",
            "MOELORA_MIN_BYTES_PER_SECOND": "1000",
            "MOELORA_RATE_WINDOW_SECONDS": "2.5",
            "MOELORA_ENDPOINT_WORKERS": "2",
            "MOELORA_S3_READ_TIMEOUT_SECONDS": "3",
            "MOELORA_READY_WAIT_SECONDS": "10",
        }
    )
    assert (tuned.list_timeout_seconds, tuned.download_timeout_seconds, tuned.min_bytes_per_second) == (5, 120, 1000)
    assert (tuned.rate_window_seconds, tuned.endpoint_workers, tuned.s3_read_timeout_seconds) == (2.5, 2, 3)
    assert tuned.ready_wait_seconds == 10
    with pytest.raises(SettingsError, match="MOELORA_ENDPOINT_WORKERS must be at least 1"):
        from_env({**ENV, "MOELORA_ENDPOINT_WORKERS": "0"})


def test_placement_needs_a_statefulset_pod_name() -> None:
    assert not from_env(ENV).placement
    placed = {**ENV, "MOELORA_PLACEMENT": "1", "MOELORA_POD_NAME": "srv-12"}
    assert from_env(placed).placement
    with pytest.raises(SettingsError, match="srv-<ordinal>"):
        from_env({**placed, "MOELORA_POD_NAME": "srv-abc"})
