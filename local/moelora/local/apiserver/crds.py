"""Our CRDs as the emulator declares them: kmock's resource info and the openAPIV3Schema of each served version."""

from __future__ import annotations

from typing import Any

import kmock

from moelora.api.crd import custom_resource_definitions


def crd_resources() -> dict[str, tuple[kmock.ResourceInfo, dict[str, Any]]]:
    """'group/version/plural' -> (kmock resource info, openAPIV3Schema) for our CRDs."""
    result = {}
    for crd in custom_resource_definitions():
        spec = crd["spec"]
        for version in spec["versions"]:
            info = kmock.ResourceInfo(
                namespaced=spec["scope"] == "Namespaced",
                kind=spec["names"]["kind"],
                singular=spec["names"]["singular"],
                shortnames=spec["names"].get("shortNames", []),
                categories=spec["names"].get("categories", []),
                subresources=set(version.get("subresources", {})),
                verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
            )
            result[f"{spec['group']}/{version['name']}/{spec['names']['plural']}"] = (
                info,
                version["schema"]["openAPIV3Schema"],
            )
    return result
