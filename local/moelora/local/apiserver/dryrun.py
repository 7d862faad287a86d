"""Server-side dry runs: a write that passed every check is answered as if done, and nothing is stored.

kubectl asks with `?dryRun=All` (`apply`, `create`, `patch`, `label`... `--dry-run=server`), and a delete also in
its DeleteOptions body (`dryRun: [All]`). The answer is the object the write would store: 201 for a create (409
AlreadyExists when the name is taken, as the real server answers), 200 with the patched object for an update, 200
with the object for a delete (404 NotFound when there is none).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import dicts as kmock_dicts
from kmock._internal import enums as kmock_enums
from kmock._internal import rendering as kmock_rendering

_WRITES = (kmock_enums.action.CREATE, kmock_enums.action.UPDATE, kmock_enums.action.DELETE)


def requested(request: kmock_rendering.Request) -> bool:
    """Whether `request` is a write that asks for a dry run."""
    if request.action not in _WRITES:
        return False
    options = request.data if request.action == kmock_enums.action.DELETE and isinstance(request.data, dict) else {}
    return request.params.get("dryRun") == "All" or options.get("dryRun") == ["All"]


def answer(request: kmock_rendering.Request, *, objects: Mapping[Any, Any]) -> aiohttp.web.Response:
    """The response to a checked dry-run write, given the emulator's stored objects (kmock's, keyed by
    (resource, namespace, name)); raises kmock.KubernetesError for 409 and 404."""
    resource = request.resource
    if request.action == kmock_enums.action.CREATE:
        meta = (request.data or {}).get("metadata") or {}
        name = meta.get("name")
        if _stored(objects, (resource, meta.get("namespace"), name)) is not None:
            plural = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
            raise kmock.KubernetesError(status=409, reason="AlreadyExists", message=f'{plural} "{name}" already exists')
        return aiohttp.web.json_response(request.data, status=201)
    current = _stored(objects, (resource, request.namespace, request.name))
    if request.name is None or current is None:
        raise kmock.KubernetesNotFoundError()
    if request.action == kmock_enums.action.UPDATE and isinstance(request.data, dict):
        current = dict(kmock_dicts.patch_dict(current, request.data))
    return aiohttp.web.json_response(current)


def _stored(objects: Mapping[Any, Any], key: tuple[Any, Any, Any]) -> dict[str, Any] | None:
    if key not in objects or objects[key].deleted:
        return None
    return copy.deepcopy(objects[key].raw)
