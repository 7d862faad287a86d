"""The runtime adapter API is the agent's alone (issue 16), on the real stack: vLLM with the admin guard, the agent,
a client API key from a Secret. One replica of its own (not the shared stack of conftest.py), with the client key
set from the start; the tests run in file order and build on each other.
"""

from __future__ import annotations

import base64
import json
import pathlib
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local import kubelet, manifests, models, stack
from moelora.operator.render.engine import VLLM_PORT
from moelora.operator.render.service import AGENT_PORT

from .conftest import S3_KEYS

pytestmark = pytest.mark.slow

SERVER = "locked"
CLIENT_KEY = "e2e-client-api-key-0001"
ADMIN_HEADER = "X-Moelora-Admin-Key"


def _call(
    url: str, *, body: Any = None, bearer: str | None = None, admin: str | None = None, method: str | None = None
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    if admin is not None:
        headers[ADMIN_HEADER] = admin
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def _until(check: Any, *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.25)
    raise AssertionError(f"not reached in {timeout:.0f} s: {what}")


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[stack.Stack, dict[str, pathlib.Path]]]:
    root = tmp_path_factory.mktemp("locked")
    with stack.Stack(root=root, s3_keys=S3_KEYS, agent_env={"MOELORA_POLL_SECONDS": "1"}) as running:
        running.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "client-api-key"},
                "data": {"api-key": base64.b64encode(CLIENT_KEY.encode()).decode()},
            }
        )
        server = manifests.model_server(name=SERVER, s3_endpoint=running.s3.endpoint_url)  # type: ignore[union-attr]
        server["spec"]["apiKeySecret"] = {"name": "client-api-key"}
        running.apply(server)
        made = {
            name: models.make_adapter(
                model_dir=running.model_dir,
                path=root / "adapters" / name,
                base_model_name=manifests.BASE_MODEL_NAME,
                rank=8,
                seed=seed,
            )
            for name, seed in (("alpha", 21), ("beta", 22))
        }
        for name, path in made.items():
            running.upload_adapter(source=path, name=name)
            running.apply(manifests.adapter(name=name, model_server=SERVER, uri=manifests.adapter_uri(name)))
        running.wait_pods(SERVER, replicas=1, timeout=400)
        yield running, made


def _pod(local: stack.Stack) -> kubelet.LocalPod:
    (pod,) = local.kubelet.pods_of(SERVER)  # type: ignore[union-attr]
    return pod


def _complete(url: str, model: str, bearer: str | None = CLIENT_KEY) -> tuple[int, Any]:
    body = {"model": model, "prompt": "a mixture of experts", "max_tokens": 6, "temperature": 0}
    return _call(f"{url}/v1/completions", body=body, bearer=bearer)


def _served(url: str) -> dict[str, str]:
    status, answer = _call(f"{url}/v1/models", bearer=CLIENT_KEY)
    assert status == 200, answer
    return {card["id"]: card.get("root") or "" for card in answer["data"] if card.get("parent")}


def _metric(local: stack.Stack, action: str) -> float:
    with urllib.request.urlopen(f"{_pod(local).url(AGENT_PORT)}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f'moelora_foreign_adapters_total{{action="{action}"}}'):
            return float(line.split()[-1])
    return 0.0


def _events(local: stack.Stack, reason: str) -> list[dict[str, Any]]:
    listing = local.read(f"/api/v1/namespaces/{local.namespace}/events") or {}
    return [e for e in listing.get("items", []) if e.get("reason") == reason]


def test_the_agent_loads_adapters_through_the_client_key(locked: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, _ = locked
    for name in ("alpha", "beta"):
        local.wait_adapter(name, phase="Loaded", replicas=1, timeout=120)
    local.wait_pods(SERVER, replicas=1, timeout=60)  # Ready: the agent got through the guard and the API key
    assert set(_served(_pod(local).url(VLLM_PORT))) == {"alpha", "beta"}


def test_clients_need_the_api_key(locked: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    url = _pod(locked[0]).url(VLLM_PORT)
    assert _complete(url, "alpha", bearer=None)[0] == 401
    assert _complete(url, "alpha", bearer="wrong")[0] == 401
    for model in (SERVER, "alpha"):
        status, answer = _complete(url, model)
        assert status == 200 and answer["choices"][0]["text"] is not None


def test_clients_cannot_load_or_unload_adapters(locked: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, made = locked
    url = _pod(local).url(VLLM_PORT)
    for bearer in (None, CLIENT_KEY):
        intruder = {"lora_name": "intruder", "lora_path": str(made["alpha"])}
        status, answer = _call(f"{url}/v1/load_lora_adapter", body=intruder, bearer=bearer)
        assert status == 403 and "adapter agent" in answer["error"]["message"]
        status, _ = _call(f"{url}/v1/unload_lora_adapter", body={"lora_name": "alpha"}, bearer=bearer)
        assert status == 403
        assert _call(f"{url}/v1/load_lora_adapter", body={}, bearer=bearer, admin="guessed")[0] == 403
    assert set(_served(url)) == {"alpha", "beta"}
    assert _complete(url, "alpha")[0] == 200


def _admin_key(local: stack.Stack) -> str:
    """The pod's key, read from the volume as an attacker who got into the pod would."""
    return (_pod(local).plan.volumes["admin-key"] / "key").read_text().strip()


def test_an_injected_adapter_is_unloaded_and_reported(locked: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, made = locked
    url = _pod(local).url(VLLM_PORT)
    status, answer = _call(
        f"{url}/v1/load_lora_adapter",
        body={"lora_name": "intruder", "lora_path": str(made["alpha"])},
        bearer=CLIENT_KEY,
        admin=_admin_key(local),
    )
    assert status == 200, answer
    _until(lambda: "intruder" not in _served(url), timeout=30, what="the agent unloads the injected adapter")
    assert _metric(local, "unloaded") == 1
    (event,) = _until(lambda: _events(local, "ForeignAdapterUnloaded"), timeout=30, what="the Event")
    assert event["involvedObject"]["kind"] == "Pod" and event["involvedObject"]["name"] == _pod(local).name
    assert "'intruder'" in event["message"]
    assert set(_served(url)) == {"alpha", "beta"}


def test_an_adapter_replaced_in_place_is_put_back(locked: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, made = locked
    url = _pod(local).url(VLLM_PORT)
    own = _served(url)["beta"]
    before = _complete(url, "beta")[1]["choices"][0]["text"]
    status, answer = _call(
        f"{url}/v1/load_lora_adapter",
        body={"lora_name": "beta", "lora_path": str(made["alpha"]), "load_inplace": True},
        bearer=CLIENT_KEY,
        admin=_admin_key(local),
    )
    assert status == 200, answer
    _until(lambda: _metric(local, "replaced") >= 1, timeout=30, what="the agent notices the replacement")
    _until(lambda: _served(url).get("beta") == own, timeout=30, what="the agent's own files again")
    assert _complete(url, "beta")[1]["choices"][0]["text"] == before
    assert _until(lambda: _events(local, "ForeignAdapterReplaced"), timeout=30, what="the Event")
    body = local.adapter("beta")
    assert body is not None and body["status"]["phase"] == "Loaded"
