"""The objects a ModelServer owns: one pure function of its spec and of what the operator observed around it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from importlib.resources.abc import Traversable
from typing import Any

from moelora.api import ModelServerSpec
from moelora.operator import policy
from moelora.operator.errors import SpecProblem
from moelora.operator.render import (
    autoscaling,
    gateway,
    kernel_configs,
    model_cache,
    multinode,
    naming,
    secret_access,
    statefulset,
)
from moelora.operator.render.deployment import deployment
from moelora.operator.render.disruption import disruption_budget
from moelora.operator.render.engine import required_claims, required_secrets
from moelora.operator.render.service import service
from moelora.operator.settings import Settings

# Children rendered only sometimes -> their names: when none of that kind and name is rendered, ours is deleted.
OPTIONAL_CHILDREN: dict[tuple[str, str], tuple[Callable[[str], str], ...]] = {
    ("apps/v1", "Deployment"): (lambda name: name,),  # without spec.placement, or replaced by a LeaderWorkerSet
    ("apps/v1", "StatefulSet"): (lambda name: name,),  # with spec.placement
    ("v1", "Service"): (statefulset.headless_service_name,),  # with spec.placement
    ("v1", "ConfigMap"): (
        kernel_configs.owned_config_map_name,  # kernels.configs=auto
        gateway.model_names_config_map_name,  # routing.gateway.enabled
    ),
    ("policy/v1", "PodDisruptionBudget"): (lambda name: name,),  # two replicas or more
    (secret_access.RBAC_API_VERSION, "Role"): (secret_access.name,),  # adapters that name Secrets
    (secret_access.RBAC_API_VERSION, "RoleBinding"): (secret_access.name,),
    (multinode.LWS_API_VERSION, "LeaderWorkerSet"): (multinode.lws_name,),  # nodes > 1
    (gateway.POOL_API_VERSION, "InferencePool"): (lambda name: name,),  # routing.gateway.enabled
    (gateway.ROUTE_API_VERSION, "HTTPRoute"): (lambda name: name,),
    (autoscaling.HPA_API_VERSION, "HorizontalPodAutoscaler"): (lambda name: name,),  # autoscaling.engine hpa
    (autoscaling.KEDA_API_VERSION, "ScaledObject"): (lambda name: name,),  # autoscaling.engine keda
}
# Children rendered in numbers that vary (one per pod): (apiVersion, kind) -> their component label; those of the
# server with that label that are not rendered are deleted.
COUNTED_CHILDREN: dict[tuple[str, str], str] = {
    ("v1", "Service"): gateway.HOME_COMPONENT,  # routing.gateway.routeToHome: one per pod
    (gateway.ROUTE_API_VERSION, "HTTPRoute"): gateway.HOME_COMPONENT,  # and one per 16 pods
}
# Kind -> the kinds it is applied only after (children are rendered in this order): when a name is taken by an
# object that is not ours, what depends on it is left alone too. The pods would mount a foreign kernel ConfigMap;
# the Service, budget and Secret grant exist for our pods; a RoleBinding to a foreign Role would grant what its
# author chose. While a name is taken nothing new is created (model_servers.apply_children), but what exists of ours
# still reconciles: each write touches only objects we own, and holding it back would let anyone freeze a running
# server by taking one name (a budget's, before the server scales to two). Of the two ConfigMaps,
# the kernel configs' comes first and the body-based router's just before the HTTPRoute, the only kind after it that
# needs a ConfigMap: a foreign one of that name holds back the route, never the workload.
NEEDS: dict[str, set[str]] = {
    "Job": {"PersistentVolumeClaim"},  # never fill a claim someone else made
    "Deployment": {"ConfigMap", "PersistentVolumeClaim", "Job"},
    "LeaderWorkerSet": {"ConfigMap", "PersistentVolumeClaim", "Job"},
    "StatefulSet": {"ConfigMap", "PersistentVolumeClaim", "Job"},
    "Service": {"Deployment", "LeaderWorkerSet", "StatefulSet"},
    "InferencePool": {"Deployment", "LeaderWorkerSet", "StatefulSet"},
    "HTTPRoute": {"InferencePool", "ConfigMap", "Service"},  # no route for names a foreign ConfigMap would map
    "HorizontalPodAutoscaler": {"Deployment", "LeaderWorkerSet", "StatefulSet"},
    "ScaledObject": {"Deployment", "LeaderWorkerSet", "StatefulSet"},
    "PodDisruptionBudget": {"Deployment", "StatefulSet"},
    "Role": {"Deployment", "StatefulSet"},
    "RoleBinding": {"Role", "Deployment", "StatefulSet"},
}
# Kinds deleted, when no longer rendered, before any child is applied. KEDA's admission webhook refuses a ScaledObject
# whose target an HPA it does not own already scales ("the workload ... is already managed by the hpa ...",
# kedacore/keda apis/keda/v1alpha1/scaledobject_webhook.go), so hpa -> keda must delete the HPA first; keda -> hpa
# deletes the ScaledObject first too, which takes KEDA's own HPA with it, so no two HPAs scale the server at once.
REPLACED_FIRST = {"HorizontalPodAutoscaler", "ScaledObject"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
SECRET_GRANT_KINDS = {"Role", "RoleBinding"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Surroundings:
    """What the children depend on besides the spec, read from the cluster before rendering."""

    # Secret name -> whether it exists, for each Secret the pod needs (engine.required_secrets); None (or absent)
    # when the operator may not read Secrets there, so the pods' own events tell instead.
    secrets_exist: Mapping[str, bool | None] = dataclasses.field(default_factory=dict)
    # The same for each PersistentVolumeClaim of the user's the pod mounts (engine.required_claims).
    claims_exist: Mapping[str, bool | None] = dataclasses.field(default_factory=dict)
    # The ConfigMap named by kernels.configMapName; None when absent or not named.
    kernel_config_map: Mapping[str, Any] | None = None
    # The credentials Secrets the server's LoRAAdapters name (the agents' Role grants get on exactly these).
    adapter_secrets: frozenset[str] = frozenset()
    # The shared model cache as observed (model_cache.state); None without spec.model.cache.
    model_cache: model_cache.CacheState | None = None
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
    multinode.check(spec, name=name)
    for secret, needed_by in required_secrets(spec):
        if surroundings.secrets_exist.get(secret) is False:
            raise SpecProblem("SecretNotFound", f"{needed_by} Secret {secret!r} does not exist in {namespace}")
    for claim, needed_by in required_claims(spec):
        if surroundings.claims_exist.get(claim) is False:
            raise SpecProblem(
                "ClaimNotFound", f"{needed_by} PersistentVolumeClaim {claim!r} does not exist in {namespace}"
            )
    volume = kernel_configs.volume(
        spec,
        name=name,
        namespace=namespace,
        labels=naming.labels(name),
        root=kernel_bundle,
        user_config_map=surroundings.kernel_config_map,
    )
    children: list[dict[str, Any]] = []
    model_claim = None
    if spec.model.cache is not None:
        children += [
            model_cache.claim(spec, server=name, namespace=namespace),
            model_cache.fetch_job(spec, server=name, namespace=namespace, settings=settings),
        ]
        model_claim = model_cache.claim_name(spec, server=name)
    # Never half-filled weights: until the cache is Ready the workload is not rendered, so the one that exists (if
    # any) keeps serving what it served.
    if spec.model.cache is None or (surroundings.model_cache is not None and surroundings.model_cache.ready):
        workload = deployment(
            spec, name=name, namespace=namespace, settings=settings, kernel_configs=volume, model_claim=model_claim
        )
        if multinode.is_multi_node(spec):
            workload = multinode.leader_worker_set(spec, workload)
        elif spec.placement is not None:
            workload = statefulset.statefulset(workload, replicas=max(spec.replicas, surroundings.assigned_pods))
        children.append(workload)
    selector = multinode.serving_selector(spec, name=name)
    children.append(service(name=name, namespace=namespace, selector=selector))
    if spec.placement is not None:
        children.append(statefulset.headless_service(name=name, namespace=namespace))
    if spec.routing.gateway.enabled:
        children += [
            gateway.inference_pool(spec, name=name, namespace=namespace, selector=selector),
            gateway.model_names_config_map(spec, name=name, namespace=namespace),
            gateway.http_route(spec, name=name, namespace=namespace),
        ]
        if spec.routing.gateway.route_to_home and spec.placement is not None:
            pods = max(spec.replicas, surroundings.assigned_pods)
            gateway.check_home_names(name=name, pods=pods)
            children += gateway.home_services(name=name, namespace=namespace, pods=pods)
            children += gateway.home_routes(spec, name=name, namespace=namespace, pods=pods)
    scaler = autoscaling.autoscaler(spec, name=name, namespace=namespace)
    if scaler is not None:
        children.append(scaler)
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
