"""`python3 -m moelora.agent` as the pod runs it: a process with only environment variables."""

from __future__ import annotations

import functools
import os
import pathlib
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest

from moelora.api import GROUP, VERSION
from moelora.local import process
from moelora.local.apiserver import KubeAPI

from .conftest import KEYS, VLLM_BASE_NAME, VLLM_MAX_RANK, s3_client, upload


def status_code(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


wait_for = functools.partial(process.wait_for, timeout=60.0, interval=0.2)


def test_bad_environment_exits_2_naming_the_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOELORA_")}
    result = subprocess.run(
        [sys.executable, "-m", "moelora.agent"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2 and "MOELORA_NAMESPACE" in result.stderr


def test_fetch_model(s3_endpoint: str, bucket: str, tmp_path: pathlib.Path) -> None:
    files = {"config.json": b"{}", "model.safetensors": b"w" * 3000, "tokenizer/tokenizer.json": b"{}"}
    upload(s3_endpoint, bucket, "models/tiny/", files)
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": s3_endpoint, "AWS_REGION": "us-east-1", **KEYS}
    dest = tmp_path / "models"
    result = subprocess.run(
        [sys.executable, "-m", "moelora.agent", "fetch-model", f"s3://{bucket}/models/tiny", str(dest)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert {
        str(p.relative_to(dest)): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and p.name != ".moelora-complete"
    } == files
    missing = subprocess.run(
        [sys.executable, "-m", "moelora.agent", "fetch-model", f"s3://{bucket}/nothing", str(tmp_path / "other")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 1 and "SourceNotFound" in missing.stderr


@pytest.mark.slow
def test_the_process_serves_adapters_and_reports_status(
    s3_endpoint: str, bucket: str, tiny: dict[str, Any], clean_vllm: str, tmp_path: pathlib.Path
) -> None:
    for path in tiny["v1"].iterdir():
        s3_client(s3_endpoint).put_object(Bucket=bucket, Key=f"a1/{path.name}", Body=path.read_bytes())
    port = process.free_port()
    with KubeAPI(namespace="team") as api:
        env = {
            **os.environ,
            "KUBECONFIG": str(api.kubeconfig),
            "MOELORA_NAMESPACE": "team",
            "MOELORA_POD_NAME": "srv-abc-0",
            "MOELORA_MODEL_SERVER": "srv",
            "MOELORA_BASE_MODEL": VLLM_BASE_NAME,
            "MOELORA_MAX_LORA_RANK": str(VLLM_MAX_RANK),
            "MOELORA_TARGET_MODULES": "",
            "MOELORA_VLLM_URL": clean_vllm,
            "MOELORA_CACHE_DIR": str(tmp_path / "cache"),
            "MOELORA_CACHE_BYTES": str(1 << 30),
            "MOELORA_PORT": str(port),
            "MOELORA_POLL_SECONDS": "0.5",
            "AWS_ENDPOINT_URL_S3": s3_endpoint,
            "AWS_REGION": "us-east-1",
            **KEYS,
        }
        log = tmp_path / "agent.log"
        agent = process.spawn(argv=[sys.executable, "-m", "moelora.agent"], env=env, log_path=log)
        try:
            wait_for(lambda: status_code(f"http://127.0.0.1:{port}/healthz") == 200)
            client = kubernetes.config.new_client_from_config(config_file=str(api.kubeconfig))
            custom = kubernetes.client.CustomObjectsApi(client)
            custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                "team",
                "loraadapters",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "LoRAAdapter",
                    "metadata": {"name": "a1"},
                    "spec": {"modelServer": "srv", "source": {"uri": f"s3://{bucket}/a1/"}},
                },
            )

            def loaded() -> bool:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, "team", "loraadapters", "a1")
                return bool(obj.get("status", {}).get("replicas", {}).get("srv-abc-0", {}).get("loaded"))

            wait_for(loaded)
            wait_for(lambda: status_code(f"http://127.0.0.1:{port}/readyz") == 200)
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, "team", "loraadapters", "a1")
            assert obj["status"]["rank"] == 8 and obj["status"]["baseModel"] == VLLM_BASE_NAME
            client.close()
        finally:
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "loaded adapter a1" in text and KEYS["AWS_SECRET_ACCESS_KEY"] not in text
