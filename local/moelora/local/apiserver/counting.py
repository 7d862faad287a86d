"""An emulator that counts what its clients cost it: requests by verb and resource, and the watch events it sends.

For the tests and benchmarks that check how the operator's and the agents' API traffic grows with a cluster's
size. Clients are told apart by their User-Agent's product: `kopf`, `openapi-generator` (the kubernetes client:
the operator's handlers, the agents), `python-urllib` (tests), `kubectl`.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
from kmock._internal import enums as kmock_enums
from kmock._internal import rendering as kmock_rendering

from moelora.local.apiserver.emulator import Emulator

Key = tuple[str, str, str]  # (client, verb, resource[/subresource])


def client_of(request: kmock_rendering.Request) -> str:
    return (request.headers.get("User-Agent") or "unknown").split("/")[0].lower()


def _resource(request: kmock_rendering.Request) -> str:
    plural = request.resource.plural if request.resource is not None else request.url.path
    return f"{plural}/{request.subresource}" if request.subresource else str(plural)


@attrs.define(kw_only=True)
class CountingEmulator(Emulator):
    """`requests[(client, verb, resource)]`: requests other than watches; `watch_events[(client, resource)]`:
    events sent on watch streams (bookmarks excluded); `listed[(client, resource)]`: objects sent in lists.
    `reset()` starts a new count."""

    requests: collections.Counter[Key] = attrs.field(factory=collections.Counter, init=False)
    watch_events: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter, init=False)
    listed: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter, init=False)

    def reset(self) -> None:
        self.requests.clear()
        self.watch_events.clear()
        self.listed.clear()

    def total(self, *, client: str | None = None, exclude: tuple[str, ...] = ("events",)) -> int:
        """Requests of `client` (None: all) outside the `exclude`d resources (kopf's own Events, by default)."""
        return sum(
            count
            for (who, _, resource), count in self.requests.items()
            if (client is None or who == client) and resource.split("/")[0] not in exclude
        )

    async def _handle(self, request: kmock_rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.action != kmock_enums.action.WATCH:
            self.requests[(client_of(request), request.method.name.lower(), _resource(request))] += 1
        return await super()._handle(request)

    async def _serve_list(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        result = await super()._serve_list(request)
        if isinstance(result, dict):
            self.listed[(client_of(request), _resource(request))] += len(result.get("items") or [])
        return result

    async def _watch(self, request: kmock_rendering.Request) -> AsyncIterator[Any]:
        key = (client_of(request), _resource(request))
        async for event in super()._watch(request):
            if isinstance(event, dict) and event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                self.watch_events[key] += 1
            yield event
