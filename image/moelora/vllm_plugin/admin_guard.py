"""An ASGI middleware for vLLM's API server (`--middleware moelora.vllm_plugin.admin_guard.AdminGuard`): only the
adapter agent of the same pod may change what the server serves.

Client routes (completions, chat, embeddings, the model list, health, metrics...) pass untouched. Every other
route — the runtime LoRA load/unload, SageMaker's `/adapters`, sleep/wake, profiling, cache resets, weight updates,
`collective_rpc`, and whatever a later vLLM adds — needs the header `X-Moelora-Admin-Key` with the per-pod key the
agent writes to the file named by `MOELORA_ADMIN_KEY_FILE` (an in-memory emptyDir only the two containers mount).
An allowlist, not a denylist: vLLM grows admin routes from release to release (0.32 has over 30, some reached
through third-party routers), so an unknown path is refused rather than trusted. No key file, an empty one or a
wrong header: HTTP 403. The client's address is never trusted (a mesh sidecar or port-forward comes from loopback).

Pure ASGI with the standard library only, so vLLM imports it in milliseconds and it runs before any other middleware
(vLLM adds `--middleware` last, which makes it the outermost).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["DEFAULT_KEY_FILE", "HEADER", "KEY_FILE_ENV", "AdminGuard", "KeyFile", "is_client_route"]

KEY_FILE_ENV = "MOELORA_ADMIN_KEY_FILE"
DEFAULT_KEY_FILE = "/var/run/moelora/admin/key"
HEADER = "x-moelora-admin-key"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# What a tenant's client may call: inference, tokenization, the model list, health and metrics (vLLM 0.32 paths,
# and /v1/decisions, an inference route 0.33 adds).
CLIENT_ROUTES = frozenset(
    {
        "/health",
        "/ping",
        "/version",
        "/load",
        "/metrics",
        "/v1/models",
        "/v1/completions",
        "/v1/completions/render",
        "/v1/completions/derender",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/chat/completions/render",
        "/v1/chat/completions/derender",
        "/v1/responses",
        "/v1/responses/render",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/messages/render",
        "/v1/embeddings",
        "/v1/score",
        "/v1/rerank",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/realtime",
        "/v1/systemone",
        "/v1/decisions",
        "/v2/embed",
        "/v2/rerank",
        "/cohere/v2/chat",
        "/pooling",
        "/classify",
        "/score",
        "/rerank",
        "/tokenize",
        "/detokenize",
        "/tokenizer_info",
        "/generative_scoring",
        "/inference/v1/generate",
        "/invocations",
    }
)
# A stored response by id, and cancelling it: per-request client routes.
_CLIENT_PATTERN = re.compile(r"^/v1/responses/[^/]+(/cancel)?$")


def is_client_route(path: str) -> bool:
    return path in CLIENT_ROUTES or bool(_CLIENT_PATTERN.match(path))


class KeyFile:
    """The agent's key, re-read only when the file changes (one stat per admin request)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._digest: bytes | None = None

    def digest(self) -> bytes | None:
        """sha256 of the key, or None when there is no usable key (missing, unreadable or empty file)."""
        try:
            stat = os.stat(self.path)
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                with open(self.path, "rb") as file:
                    key = file.read(4096).strip()
                self._digest = hashlib.sha256(key).digest() if key else None
                self._seen = seen
        except OSError:
            self._seen = self._digest = None
        return self._digest

    def matches(self, offered: bytes | None) -> bool:
        expected = self.digest()
        if expected is None or not offered:
            return False
        return hmac.compare_digest(hashlib.sha256(offered.strip()).digest(), expected)


class AdminGuard:
    """Refuses every non-client route without the agent's key (see the module docstring)."""

    def __init__(self, app: ASGIApp, key_file: str | None = None) -> None:
        self.app = app
        self.key_file = KeyFile(key_file or os.environ.get(KEY_FILE_ENV) or DEFAULT_KEY_FILE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root_path = scope.get("root_path") or ""
        if root_path and path.startswith(root_path):
            path = path[len(root_path) :] or "/"
        if is_client_route(path) or self.key_file.matches(_header(scope, HEADER.encode())):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "admin route"})
            return
        await _forbidden(send, path)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value)
    return None


async def _forbidden(send: Send, path: str) -> None:
    message = (
        f"{path[:200]} changes what this server serves: only the moelora adapter agent of this pod may call it. "
        "Manage adapters with LoRAAdapter objects."
    )
    body = json.dumps(
        {"error": {"message": message, "type": "Forbidden", "param": None, "code": 403}, "object": "error"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
