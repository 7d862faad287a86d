"""The adapters' routes: each one's body-based router ConfigMap (render/gateway.py), owned by its LoRAAdapter so it
goes with it, written only where the pass found its route changed (decide/routes.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from moelora.api import GROUP, VERSION
from moelora.operator.control.context import Context, wall_clock
from moelora.operator.decide.indexes import AdapterEntry
from moelora.operator.decide.rollup import Emission
from moelora.operator.kube import apply, events
from moelora.operator.render import gateway, naming

logger = logging.getLogger(__name__)

ROUTE_NAME_TAKEN = "RouteNameTaken"


def write_routes(
    *, memo: Context, namespace: str, server: str, routes: Mapping[str, str | None], adapters: list[AdapterEntry]
) -> dict[str, str | None]:
    """Create, patch or delete each adapter's ConfigMap as `routes` says (None: delete); the routes now in place, by
    adapter. A name taken by a ConfigMap that is not the adapter's is left alone, reported in a Warning Event on the
    adapter (folded into one while it lasts, as the adapters' other Events), and recorded as written so that only the
    resync tries it again."""
    by_name = {entry.name: entry for entry in adapters}
    done: dict[str, str | None] = {}
    # One list of the server's ConfigMaps, so that a pass judging every route again (after a start or a resync)
    # writes only those that differ instead of reading each one.
    labels = {**naming.selector(server), naming.LABEL_COMPONENT: gateway.ROUTE_COMPONENT}
    listed = apply.list_owned(
        api=memo.api, api_version="v1", kind="ConfigMap", namespace=namespace, labels=labels, owner_uid=None
    )
    stored = {obj["metadata"]["name"]: obj for obj in listed}
    for name, header in routes.items():
        entry = by_name.get(name)
        uid = ((entry.body or {}).get("metadata") or {}).get("uid") if entry is not None else None
        if entry is None or not uid:
            continue
        config_map = gateway.route_config_map_name(name)
        if header is None:
            if config_map in stored:
                apply.delete_if_owned(
                    api=memo.api,
                    api_version="v1",
                    kind="ConfigMap",
                    namespace=namespace,
                    name=config_map,
                    owner_uid=uid,
                )
            done[name] = None
            continue
        desired = gateway.route_config_map(
            adapter=name, served=entry.served or name, namespace=namespace, server=server, header=header
        )
        owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LoRAAdapter", "name": name, "uid": uid}
        desired["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
        found = stored.get(config_map)
        if found is not None and apply.owned_by(found, uid) and found.get("data") == desired["data"]:
            done[name] = header
            continue
        try:
            _, action = apply.ensure(api=memo.api, desired=desired, owner_uid=uid)
        except apply.NotOwned:
            message = f"ConfigMap {config_map} exists and is not LoRAAdapter {name}'s: the gateway cannot route it"
            involved = events.adapter_reference({"name": name, "namespace": namespace, "uid": uid})
            warning = Emission(type="Warning", reason=ROUTE_NAME_TAKEN, message=message)
            memo.events.record(api=memo.api, involved=involved, emission=warning, now=wall_clock())
        else:
            if action != "unchanged":
                logger.info("route of %s/%s %s: %s", namespace, name, action, header)
        done[name] = header
    return done
