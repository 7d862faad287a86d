"""The objects a ModelServer owns: one pure function of its spec and of what the operator observed around it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from importlib.resources.abc import Traversable
from typing import Any

from moelora.api import ModelServerSpec
from moelora.operator import kernel_configs, naming, policy, secret_access, statefulset
from moelora.operator.deployment import deployment
from moelora.operator.disruption import disruption_budget
from moelora.operator.engine import required_secrets
from moelora.operator.errors import SpecProblem
from moelora.operator.service import service
from moelora.operator.settings import Settings

# Children rendered only sometimes -> their name: when none of that kind and name is rendered, ours is deleted.
OPTIONAL_CHILDREN: dict[tuple[str, str], Callable[[str], str]] = {
    ("apps/v1", "Deployment"): lambda name: name,  # without spec.placement
    ("apps/v1", "StatefulSet"): lambda name: name,  # with spec.placement
    ("v1", "Service"): statefulset.headless_service_name,  # with spec.placement
    ("v1", "ConfigMap"): kernel_configs.owned_config_map_name,  # kernels.configs=auto
    ("policy/v1", "PodDisruptionBudget"): lambda name: name,  # two replicas or more
    (secret_access.RBAC_API_VERSION, "Role"): secret_access.name,  # adapters that name Secrets
    (secret_access.RBAC_API_VERSION, "RoleBinding"): secret_access.name,
}
# Kind -> the kinds it is applied only after (children are rendered in this order): when a name is taken by an
# object that is not ours, what depends on it is left alone too. The pods would mount a foreign kernel ConfigMap;
# the Service, budget and Secret grant exist for our pods; a RoleBinding to a foreign Role would grant what its
# author chose. The rest still reconciles: each write touches only objects we own, and holding it back would let
# anyone freeze a server by taking one name (a budget's, before the server scales to two).
NEEDS: dict[str, set[str]] = {
    "Deployment": {"ConfigMap"},
    "StatefulSet": {"ConfigMap"},
    "Service": {"Deployment", "StatefulSet"},
    "PodDisruptionBudget": {"Deployment", "StatefulSet"},
    "Role": {"Deployment", "StatefulSet"},
    "RoleBinding": {"Role", "Deployment", "StatefulSet"},
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
SECRET_GRANT_KINDS = {"Role", "RoleBinding"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Surroundings:
    """What the children depend on besides the spec, read from the cluster before rendering."""

    # Secret name -> whether it exists, for each Secret the pod needs (engine.required_secrets); None (or absent)
    # when the operator may not read Secrets there, so the pods' own events tell instead.
    secrets_exist: Mapping[str, bool | None] = dataclasses.field(default_factory=dict)
    # The ConfigMap named by kernels.configMapName; None when absent or not named.
    kernel_config_map: Mapping[str, Any] | None = None
    # The credentials Secrets the server's LoRAAdapters name (the agents' Role grants get on exactly these).
    adapter_secrets: frozenset[str] = frozenset()
    # With placement: pods the adapters' assignments still name (a scale-down keeps them until their moves end).
    assigned_pods: int = 0


def desired_children(
    spec: ModelServerSpec,
    *,
    name: str,
    namespace: str,
    settings: Settings,
    kernel_bundle: Traversable | None,
    surroundings: Surroundings,
) -> list[dict[str, Any]]:
    """The objects the server should own, without ownerReferences, in the order NEEDS assumes. Raises SpecProblem
    for what the operator refuses."""
    policy.check_image(spec.image, settings)
    policy.check_service_account(spec.service_account_name, settings)
    for secret, needed_by in required_secrets(spec):
        if surroundings.secrets_exist.get(secret) is False:
            raise SpecProblem("SecretNotFound", f"{needed_by} Secret {secret!r} does not exist in {namespace}")
    volume = kernel_configs.volume(
        spec,
        name=name,
        namespace=namespace,
        labels=naming.labels(name),
        root=kernel_bundle,
        user_config_map=surroundings.kernel_config_map,
    )
    workload = deployment(spec, name=name, namespace=namespace, settings=settings, kernel_configs=volume)
    children = [workload, service(name=name, namespace=namespace)]
    if spec.placement is not None:
        replicas = max(spec.replicas, surroundings.assigned_pods)
        children = [
            statefulset.statefulset(workload, replicas=replicas),
            children[1],
            statefulset.headless_service(name=name, namespace=namespace),
        ]
    if volume is not None and volume.owned_config_map is not None:
        children.insert(0, volume.owned_config_map)
    budget = disruption_budget(spec, name=name, namespace=namespace)
    if budget is not None:
        children.append(budget)
    role = secret_access.role(server=name, namespace=namespace, secrets=surroundings.adapter_secrets)
    if role is not None:
        account = spec.service_account_name or settings.server_service_account
        children += [role, secret_access.role_binding(server=name, namespace=namespace, service_account=account)]
    return children
