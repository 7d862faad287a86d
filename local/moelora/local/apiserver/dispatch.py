"""Requests the emulator serves without kmock's DSL matching: object requests and discovery."""

from __future__ import annotations

import re

import aiohttp.web
import kmock
from kmock._internal import enums as kmock_enums
from kmock._internal import rendering as kmock_rendering

# kmock's discovery fallbacks, by path: (pattern, the scaffold's method serving it).
_DISCOVERY = (
    (re.compile(r"/apis/[^/]+/[^/]+"), "_serve_version"),
    (re.compile(r"/apis/[^/]+"), "_serve_group"),
    (re.compile(r"/api/[^/]+"), "_serve_version"),
    (re.compile(r"/version"), "_serve_server_version"),
    (re.compile(r"/apis"), "_serve_apis"),
    (re.compile(r"/api"), "_serve_api"),
    (re.compile(r"/"), "_serve_root"),
)


class FastDispatch(kmock.KubernetesScaffold):
    """Serve object and discovery requests straight from the emulator's handlers.

    kmock matches every request against its DSL reactions, and the matching walks every request served so far, so
    it slows as a run goes on (a discovery request took seconds in the operator chaos run). With no reactions of our
    own only kmock's fallbacks would match, so these requests go to them directly; anything else takes the DSL path.
    Placed between KubernetesEmulator and KubernetesScaffold in the MRO, below the emulator's state tracking.
    """

    __slots__ = ()

    async def _handle(self, request: kmock_rendering.Request) -> aiohttp.web.StreamResponse:
        serve = (
            {
                kmock_enums.action.LIST: "_serve_list",
                kmock_enums.action.WATCH: "_serve_watch",
                kmock_enums.action.FETCH: "_serve_fetch",
                kmock_enums.action.CREATE: "_serve_create",
                kmock_enums.action.UPDATE: "_serve_update",
                kmock_enums.action.DELETE: "_serve_delete",
            }.get(request.action)
            if request.resource is not None and request.resource.plural
            else _discovery(request)
        )
        if serve is None:
            return await super()._handle(request)
        return await kmock_rendering.Response(payload=getattr(self, serve))(request)


def _discovery(request: kmock_rendering.Request) -> str | None:
    """The discovery method serving a GET of `request`'s path, as kmock's fallbacks route it; None for others."""
    if request.method != kmock_enums.method.GET:
        return None
    return next((serve for pattern, serve in _DISCOVERY if pattern.fullmatch(request.url.path)), None)
