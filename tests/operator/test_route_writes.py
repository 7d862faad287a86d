"""The adapters' router ConfigMaps as a pass writes them (control/route_writes.py): one list of the server's, then a
write only for those that differ, a delete for those no longer routed, and an Event when the name is someone else's,
folded into one when it comes back."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from moelora.operator.control import route_writes
from moelora.operator.control.context import Context
from moelora.operator.decide.indexes import AdapterEntry
from moelora.operator.kube import apply
from moelora.operator.render import gateway
from moelora.operator.settings import Settings


def entry(name: str, uid: str) -> AdapterEntry:
    return AdapterEntry(name=name, phase="Loaded", body={"metadata": {"name": name, "namespace": "ns", "uid": uid}})


def stored(name: str, uid: str, header: str) -> dict[str, Any]:
    obj = gateway.route_config_map(adapter=name, served=name, namespace="ns", server="srv", header=header)
    obj["metadata"]["ownerReferences"] = [{"uid": uid, "controller": True}]
    return obj


def test_only_the_routes_that_differ_are_written(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = [stored(name, uid, "srv@srv-0") for name, uid in (("same", "u1"), ("moved", "u2"), ("failed", "u5"))]
    listed.append(stored("taken", "other", "x"))
    calls: list[tuple[str, str]] = []

    def ensure(*, desired: dict, owner_uid: str, **_: object) -> tuple[dict, str]:
        calls.append(("ensure", desired["metadata"]["name"]))
        if desired["metadata"]["name"] == "taken-route":
            raise apply.NotOwned("ConfigMap", "taken-route")
        return desired, "patched"

    monkeypatch.setattr(apply, "list_owned", lambda **_: listed)
    monkeypatch.setattr(apply, "ensure", ensure)
    monkeypatch.setattr(apply, "delete_if_owned", lambda *, name, **_: calls.append(("delete", name)) or True)

    def create_event(*, event: dict, **_: object) -> dict:
        calls.append((event["reason"], event["involvedObject"]["name"]))
        return {**event, "metadata": {"name": "e1"}}

    monkeypatch.setattr(apply, "create_event", create_event)
    memo = Context(settings=Settings(), kernel_bundle=None, api=None, executor=concurrent.futures.ThreadPoolExecutor(1))
    adapters = [
        entry("same", "u1"),
        entry("moved", "u2"),
        entry("gone", "u3"),
        entry("taken", "u4"),
        entry("failed", "u5"),
    ]
    routes = {"same": "srv@srv-0", "moved": "srv", "gone": None, "taken": "srv", "failed": None}
    done = route_writes.write_routes(memo=memo, namespace="ns", server="srv", routes=routes, adapters=adapters)
    assert done == routes  # all in place (the taken one is reported, and left to the resync)
    # The resync tries the taken name again: its Warning is counted on the one recorded, not made again.
    monkeypatch.setattr(
        apply, "patch_event", lambda **_: calls.append(("counted", "taken")) or {"metadata": {"name": "e1"}, "count": 2}
    )
    route_writes.write_routes(memo=memo, namespace="ns", server="srv", routes={"taken": "srv"}, adapters=adapters)
    assert calls == [
        ("ensure", "moved-route"),
        ("ensure", "taken-route"),
        (route_writes.ROUTE_NAME_TAKEN, "taken"),
        ("delete", "failed-route"),  # "gone" has no ConfigMap listed: nothing to delete
        ("ensure", "taken-route"),
        ("counted", "taken"),
    ]
