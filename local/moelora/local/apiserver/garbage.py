"""Garbage collection as kube-controller-manager's collector does it: an object whose ownerReferences all name
absent owners is deleted (background propagation), whether its last owner just went or it was itself written
naming only owners that are gone.

The rule is the real collector's (pkg/controller/garbagecollector): attemptToDeleteItem deletes an item none of
whose references is solid; isDangling looks each owner up live, by its kind and name, in the dependent's namespace
for a namespaced kind, and calls it absent when nothing is there or the uid differs. A kind the server does not
serve, or a namespaced owner of a cluster-scoped dependent, cannot be resolved and keeps the object (kubernetes.io
docs, Garbage Collection, "Owners and dependents"). An object already being deleted is left to its finalizers.
Not emulated: removing the dangling references from an object that keeps a live owner, foreground deletion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from moelora.local.apiserver.objects import now

Key = tuple[Any, str | None, str]  # kmock's object key: (resource, namespace, name)


@attrs.define(kw_only=True)
class Collector:
    """Collects garbage in an emulator's store; call it with its lock released."""

    objects: Any  # kmock's ObjectsArray
    resources: Any  # kmock's ResourcesArray
    buses: Any  # resource -> event bus, as kmock's emulator keeps them
    versions: Iterator[int]  # the emulator's resourceVersion counter
    lock: asyncio.Lock
    _pending: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    def written(self, key: Key) -> None:
        """After a create or update of `key`: if it names owners, check them soon after (the write has succeeded)."""
        obj = self.objects[key] if key in self.objects else None
        if obj is not None and not obj.deleted and obj.raw.get("metadata", {}).get("ownerReferences"):
            task = asyncio.create_task(self._collect_if_ownerless(key))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def collect(self, gone: set[str]) -> None:
        """After the objects with these uids went: delete their dependents whose owners are now all absent."""
        while gone:
            async with self.lock:
                dependents = [
                    key
                    for key, obj in self.objects.items()
                    if not obj.deleted
                    and {ref.get("uid") for ref in obj.raw.get("metadata", {}).get("ownerReferences") or []} & gone
                ]
                gone = set()
                for key in dependents:
                    if self._ownerless(key) and (uid := await self._delete(key)) is not None:
                        gone.add(uid)

    async def _collect_if_ownerless(self, key: Key) -> None:
        async with self.lock:
            gone = await self._delete(key) if key in self.objects and self._ownerless(key) else None
        if gone is not None:
            await self.collect({gone})

    def _ownerless(self, key: Key) -> bool:
        """Whether the object at `key` names owners, all absent, and is not already being deleted."""
        obj = self.objects[key]
        meta = obj.raw.get("metadata", {}) if not obj.deleted else {}
        refs = meta.get("ownerReferences") or []
        if not refs or meta.get("deletionTimestamp"):
            return False
        return all(self._absent(ref, key[1]) for ref in refs)

    def _absent(self, ref: Mapping[str, Any], namespace: str | None) -> bool:
        """Whether the owner `ref` names is verifiably absent for a dependent in `namespace` (isDangling)."""
        group, _, version = str(ref.get("apiVersion") or "").rpartition("/")
        served = [r for r in self.resources if (r.group or "", r.version) == (group, version)]
        served = [r for r in served if self.resources[r].kind == ref.get("kind")]
        if not served:
            return False  # unresolvable
        namespaced = self.resources[served[0]].namespaced is not False
        if namespaced and not namespace:
            return False  # a cluster-scoped dependent naming a namespaced owner: unresolvable
        # Looked up by key under each version the kind is served in (one store per version): a write of an owned
        # object costs a few lookups, not a scan of the store.
        kind = (served[0].group or "", served[0].plural)
        keys = [
            (r, namespace if namespaced else None, ref.get("name"))
            for r in self.resources
            if (r.group or "", r.plural) == kind
        ]
        return not any(
            not (obj := self.objects[key]).deleted and obj.raw.get("metadata", {}).get("uid") == ref.get("uid")
            for key in keys
            if key in self.objects
        )

    async def _delete(self, key: Key) -> str | None:
        """Delete the object at `key` as a DELETE request does: while finalizers hold it, only a deletionTimestamp.
        Returns its uid if it went now."""
        obj = self.objects[key]
        raw = obj.raw
        if raw.get("metadata", {}).get("finalizers"):
            obj.patch({"metadata": {"deletionTimestamp": now(), "resourceVersion": str(next(self.versions))}})
            await self.buses[key[0]].put({"type": "MODIFIED", "object": obj.raw})
            return None
        obj.delete()
        await self.buses[key[0]].put({"type": "DELETED", "object": raw})
        return str(raw.get("metadata", {}).get("uid"))
