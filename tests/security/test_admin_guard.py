"""The admin guard in front of a tiny ASGI app: client routes pass, admin routes need the agent's key (no vLLM)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

from moelora.vllm_plugin import admin_guard
from moelora.vllm_plugin.admin_guard import AdminGuard

KEY = "k" * 43


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


async def _call(
    guard: AdminGuard, path: str, *, key: str | None = None, kind: str = "http", root_path: str = ""
) -> tuple[int | str, dict[str, Any] | None]:
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"X-Moelora-Admin-Key", key.encode()))
    scope = {"type": kind, "method": "POST", "path": root_path + path, "root_path": root_path, "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await guard(scope, receive, send)
    if kind == "websocket":
        return sent[0]["type"], None
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], (json.loads(body) if sent[0]["status"] == 403 else None)


@pytest.fixture
def key_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    return path


@pytest.mark.parametrize(
    "path", ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/v1/decisions"]
)
async def test_client_routes_pass_without_a_key(key_file: pathlib.Path, path: str) -> None:
    assert (await _call(AdminGuard(_app, str(key_file)), path))[0] == 200


@pytest.mark.parametrize(
    "path",
    [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",  # SageMaker's load route, a second way in
        "/adapters/alpha",
        "/sleep",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weights",
        "/v1/completions/",  # not the client route: no path tricks around the allowlist
        "//v1/load_lora_adapter",
        "/no/such/route",
    ],
)
async def test_admin_routes_refused_without_the_key(key_file: pathlib.Path, path: str) -> None:
    guard = AdminGuard(_app, str(key_file))
    for offered in (None, "wrong", KEY[:-1], ""):
        status, body = await _call(guard, path, key=offered)
        assert status == 403
        assert body is not None and body["error"]["code"] == 403
        assert "adapter agent" in body["error"]["message"]


async def test_admin_route_served_with_the_key(key_file: pathlib.Path) -> None:
    assert (await _call(AdminGuard(_app, str(key_file)), "/v1/load_lora_adapter", key=KEY))[0] == 200


async def test_no_key_file_refuses_everyone(tmp_path: pathlib.Path) -> None:
    guard = AdminGuard(_app, str(tmp_path / "missing"))
    assert (await _call(guard, "/v1/unload_lora_adapter", key=KEY))[0] == 403
    assert (await _call(guard, "/v1/unload_lora_adapter", key=""))[0] == 403
    assert (await _call(guard, "/v1/completions"))[0] == 200


async def test_empty_key_file_refuses_an_empty_header(tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "key"
    empty.write_text("")
    assert (await _call(AdminGuard(_app, str(empty)), "/v1/load_lora_adapter", key=""))[0] == 403


async def test_a_new_key_replaces_the_old_one(key_file: pathlib.Path) -> None:
    guard = AdminGuard(_app, str(key_file))
    assert (await _call(guard, "/v1/load_lora_adapter", key=KEY))[0] == 200
    fresh = key_file.with_name("key.tmp")
    fresh.write_text("another-key")
    os.replace(fresh, key_file)  # as the agent writes it: a new inode, so the cache notices
    assert (await _call(guard, "/v1/load_lora_adapter", key=KEY))[0] == 403
    assert (await _call(guard, "/v1/load_lora_adapter", key="another-key"))[0] == 200
    key_file.unlink()
    assert (await _call(guard, "/v1/load_lora_adapter", key="another-key"))[0] == 403


async def test_root_path_is_stripped(key_file: pathlib.Path) -> None:
    guard = AdminGuard(_app, str(key_file))
    assert (await _call(guard, "/v1/completions", root_path="/api"))[0] == 200
    assert (await _call(guard, "/v1/load_lora_adapter", root_path="/api"))[0] == 403


async def test_websocket_admin_route_closed(key_file: pathlib.Path) -> None:
    guard = AdminGuard(_app, str(key_file))
    assert (await _call(guard, "/v1/realtime", kind="websocket"))[0] == "websocket.accept"
    assert (await _call(guard, "/anything", kind="websocket"))[0] == "websocket.close"


async def test_lifespan_passes(key_file: pathlib.Path) -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await AdminGuard(app, str(key_file))({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


def test_key_file_from_the_environment(monkeypatch: pytest.MonkeyPatch, key_file: pathlib.Path) -> None:
    monkeypatch.setenv(admin_guard.KEY_FILE_ENV, str(key_file))
    assert AdminGuard(_app).key_file.path == str(key_file)


def test_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, moelora.vllm_plugin.admin_guard; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.strip() == "False"
