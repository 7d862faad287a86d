"""A small REST client for an API server on loopback: plain JSON over HTTP, no credentials, no dependencies."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class Rest:
    """JSON over HTTP to an API server at `url`. Methods return the decoded object, or None on 404."""

    def __init__(self, *, url: str) -> None:
        self.url = url.rstrip("/")

    def request(
        self, *, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json"
    ) -> Any:
        """One request; `content_type` applies to PATCH. None on 404, RuntimeError on any other error status."""
        data = None if body is None else json.dumps(body).encode()
        headers = {
            "Content-Type": content_type if method == "PATCH" else "application/json",
            "Accept": "application/json",
        }
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:300]!r}") from None
        return json.loads(raw) if raw else None

    def items(self, *, path: str) -> list[dict[str, Any]]:
        """The items of a list, or [] if the resource is unknown."""
        result = self.request(method="GET", path=path)
        return list((result or {}).get("items") or [])
