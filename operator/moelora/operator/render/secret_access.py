"""The Role and RoleBinding that let a ModelServer's pods `get` exactly the Secrets its LoRAAdapters name.

The agent reads an adapter's credentials Secret through the API; the chart grants the server ServiceAccount no
Secret access at all, so each server gets `get` on those names only (`resourceNames`), bound to its pods' account.
None is rendered for a server whose adapters name no Secret: a rule with no resourceNames would match every Secret.

Kubernetes lets the operator create such a Role only if it may `get` those Secrets itself (RBAC's escalation
check), which the chart's `operator.secretAccess` grants; refused, the server reports SecretGrantForbidden.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from moelora.operator.render import naming

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"


def name(server: str) -> str:
    return f"{server}-adapter-secrets"


def role(*, server: str, namespace: str, secrets: Collection[str]) -> dict[str, Any] | None:
    if not secrets:
        return None
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": {"name": name(server), "namespace": namespace, "labels": naming.labels(server)},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": sorted(secrets)}],
    }


def role_binding(*, server: str, namespace: str, service_account: str) -> dict[str, Any]:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": {"name": name(server), "namespace": namespace, "labels": naming.labels(server)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name(server)},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
