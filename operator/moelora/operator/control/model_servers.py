"""ModelServer reconcile: observe, render, apply, then write the status once and only if it changed.

Every path into a server (its own create/update/resume, the resync, an event of a child it owns, its adapters
changing what it renders) leads to a pass of its key (controller.py), which runs `reconcile` when something the
children or the status depend on moved; it compares desired with actual, so it is idempotent and repairs drift.
What only the operator can judge (unknown engine flag, missing Secret...) becomes a condition with a reason plus
one Warning Event per new reason, and leaves the running Deployment as it was.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Collection, Mapping
from typing import Any

import kopf
import kubernetes.client
import pydantic

from moelora.api import ModelServerSpec
from moelora.operator.control import metrics
from moelora.operator.control.context import Context, wall_clock
from moelora.operator.decide import indexes, status
from moelora.operator.decide.expectations import ServerKey
from moelora.operator.decide.indexes import AdapterEntry
from moelora.operator.errors import SpecProblem, problem_from_validation
from moelora.operator.kube import apply, cache_sync
from moelora.operator.render import multinode, naming
from moelora.operator.render.children import (
    COUNTED_CHILDREN,
    NEEDS,
    OPTIONAL_CHILDREN,
    REPLACED_FIRST,
    SECRET_GRANT_KINDS,
    WORKLOAD_KINDS,
    Surroundings,
    desired_children,
)
from moelora.operator.render.engine import required_claims, required_secrets
from moelora.operator.settings import Settings

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """A ModelServer as stored now, with what its children depend on."""

    body: Mapping[str, Any]
    spec: ModelServerSpec | None  # None when the models refuse the stored spec (problem says why)
    problem: SpecProblem | None
    surroundings: Surroundings


def observe(*, api: kubernetes.client.ApiClient, key: ServerKey, settings: Settings) -> Observation | None:
    """What the reconcile judges; None when the server is gone or being deleted (the garbage collector takes its
    children). The stored object, not the triggering event's copy, which may predate the last status write."""
    namespace, name = key
    body = apply.get_model_server(api=api, namespace=namespace, name=name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    try:
        spec = ModelServerSpec.model_validate(dict(body.get("spec") or {}))
    except pydantic.ValidationError as exc:
        return Observation(body=body, spec=None, problem=problem_from_validation(exc), surroundings=Surroundings())
    secrets_exist = {
        secret: apply.secret_exists(api=api, namespace=namespace, name=secret)
        for secret in dict(required_secrets(spec))
    }
    claims_exist = {
        claim: apply.claim_exists(api=api, namespace=namespace, name=claim) for claim in dict(required_claims(spec))
    }
    config_map = None
    if spec.kernels.config_map_name:
        config_map = apply.get_config_map(api=api, namespace=namespace, name=spec.kernels.config_map_name)
    cache = cache_sync.observe(
        api=api,
        spec=spec,
        namespace=namespace,
        name=name,
        owner_uid=body["metadata"]["uid"],
        now=wall_clock(),
        unbound_after=settings.model_cache_unbound_seconds,
    )
    return Observation(
        body=body,
        spec=spec,
        problem=None,
        surroundings=Surroundings(
            secrets_exist=secrets_exist, claims_exist=claims_exist, kernel_config_map=config_map, model_cache=cache
        ),
    )


def apply_children(
    *,
    api: kubernetes.client.ApiClient,
    children: list[dict[str, Any]],
    owner: Mapping[str, Any],
    held: Collection[str] = (),
) -> tuple[dict[str, Any] | None, SpecProblem | None]:
    """Create or patch every child, delete the optional ones no longer rendered (but the `held` kinds, left as they
    are). Returns the Deployment as stored
    (None unless it is ours) and the problem to report: names taken by objects that are not ours (left untouched,
    with what depends on them, and nothing new created meanwhile), or Secret grants the API server refused the
    operator."""
    meta = owner["metadata"]
    # ownerReferences: deleting the server deletes them. (Not kopf.adopt: it also copies the server's labels onto
    # the children, so a label edit on the server would rewrite every child.)
    # kopf reads any mapping's apiVersion, kind and metadata; its annotations name only its own Body wrapper.
    kopf.append_owner_reference(children, owner=dict(owner))  # type: ignore[arg-type]
    rendered = {(child["apiVersion"], child["kind"], child["metadata"]["name"]) for child in children}
    # One autoscaler gives way before the other is applied (children.REPLACED_FIRST says why).
    _delete_unrendered(api=api, meta=meta, rendered=rendered, kinds=REPLACED_FIRST - set(held))
    stored_deployment = None
    taken: list[str] = []
    forbidden: list[str] = []
    not_applied: set[str] = set()
    absent: list[dict[str, Any]] = []
    for phase in ("existing", "absent"):
        # What exists first: ours is patched, someone else's reported. Then what is missing is created, unless a name
        # is taken: a new server would otherwise run pods, or be announced on someone else's Service, for a spec its
        # status says is not applied. Ours that exist keep reconciling, so taking a name cannot freeze a server.
        for child in children if phase == "existing" else ([] if taken else absent):
            kind, child_name = child["kind"], child["metadata"]["name"]
            if NEEDS.get(kind, set()) & not_applied:
                not_applied.add(kind)
                continue
            try:
                obj, action = apply.ensure(api=api, desired=child, owner_uid=meta["uid"], create=phase == "absent")
            except apply.NotOwned:
                taken.append(f"{kind} {child_name}")
                not_applied.add(kind)
                continue
            except kubernetes.client.ApiException as exc:
                if exc.status != 403 or kind not in SECRET_GRANT_KINDS:
                    raise
                forbidden.append(f"{kind} {child_name}")  # RBAC's escalation check: see render/secret_access.py
                not_applied.add(kind)
                continue
            if obj is None:
                absent.append(child)
                continue
            if action != "unchanged":
                logger.info("%s %s/%s %s", kind, meta["namespace"], child_name, action)
            if kind in WORKLOAD_KINDS:
                stored_deployment = obj
            elif kind == "LeaderWorkerSet":
                stored_deployment = multinode.status_view(obj)
    if taken:
        not_applied |= {child["kind"] for child in absent}
    workloads = WORKLOAD_KINDS | {"LeaderWorkerSet"}
    # The workload replacing another that was not applied: keep serving with the old one.
    kept = set(held) | (workloads if workloads & not_applied else set())
    kinds = {kind for _, kind in OPTIONAL_CHILDREN} - kept - REPLACED_FIRST
    _delete_unrendered(api=api, meta=meta, rendered=rendered, kinds=kinds)
    if taken:
        server = f"ModelServer {meta['name']}"
        return stored_deployment, SpecProblem(
            status.NAME_TAKEN, "; ".join(f"{what} exists and is not owned by {server}" for what in taken)
        )
    if forbidden:
        return stored_deployment, SpecProblem(
            "SecretGrantForbidden",
            f"the API server refused {', '.join(forbidden)}: the operator may grant get only on Secrets it may get "
            "itself (chart value operator.secretAccess), so the agents cannot read their adapters' Secrets",
        )
    return stored_deployment, None


def _delete_unrendered(
    *, api: kubernetes.client.ApiClient, meta: Mapping[str, Any], rendered: set[tuple[str, str, str]], kinds: set[str]
) -> None:
    """Delete the server's optional children of `kinds` that are not in `rendered` (apiVersion, kind, name): those
    of the names OPTIONAL_CHILDREN gives, and the counted ones its label finds."""
    for (api_version, kind), optional_names in OPTIONAL_CHILDREN.items():
        if kind not in kinds:
            continue
        names = [optional_name(meta["name"]) for optional_name in optional_names]
        where = {"api": api, "api_version": api_version, "kind": kind, "namespace": meta["namespace"]}
        component = COUNTED_CHILDREN.get((api_version, kind))
        if component is not None:
            labels = {**naming.selector(meta["name"]), naming.LABEL_COMPONENT: component}
            found = apply.list_owned(**where, labels=labels, owner_uid=meta["uid"])
            names += [obj["metadata"]["name"] for obj in found]
        for name in names:
            if (api_version, kind, name) in rendered:
                continue
            deleted = apply.delete_if_owned(**where, name=name, owner_uid=meta["uid"])
            if deleted:
                logger.info("%s %s/%s deleted", kind, meta["namespace"], name)


def render_status(
    observation: Observation,
    *,
    deployment: Mapping[str, Any] | None,
    problem: SpecProblem | None,
    adapters: list[AdapterEntry],
    now: datetime.datetime,
    placement_short: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """The whole status on the wire, from the observation, the Deployment as stored and the adapters' phases."""
    body = observation.body
    meta = body["metadata"]
    spec = observation.spec
    if spec is None:  # refused: the replica count is all the status needs from it (unvalidated: no model)
        replicas = int((body.get("spec") or {}).get("replicas") or 0)
        spec = ModelServerSpec.model_construct(replicas=replicas)  # type: ignore[call-arg]
    return status.model_server_status(
        spec,
        name=meta["name"],
        namespace=meta["namespace"],
        generation=meta.get("generation"),
        deployment=deployment,
        problem=problem,
        adapters=status.adapter_counts([entry.phase for entry in adapters]),
        previous=status.stored_server_status(body.get("status") or {}),
        now=now,
        model_cache=observation.surroundings.model_cache.status if observation.surroundings.model_cache else None,
        placement_short=placement_short,
    ).to_wire()


@metrics.timed("ModelServer")
def reconcile(
    *,
    memo: Context,
    key: ServerKey,
    adapters: list[AdapterEntry],
    assigned_pods: int = 0,
    placement_short: tuple[int, int] = (0, 0),
) -> SpecProblem | None:
    """Desired vs actual for one ModelServer, then its status, written once and only if it changed. The problem
    reported, if any. With placement: the pods its adapters' assignments name, and the copies no pod had room for
    (decide/plan.py)."""
    namespace, name = key
    observation = observe(api=memo.api, key=key, settings=memo.settings)
    if observation is None:
        memo.metrics.set_children(key, None)
        return None
    problem = observation.problem
    stored_deployment = None
    surroundings = dataclasses.replace(
        observation.surroundings,
        adapter_secrets=indexes.adapter_secrets(adapters),
        assigned_pods=assigned_pods,
    )
    if observation.spec is not None:
        try:
            children = desired_children(
                observation.spec,
                name=name,
                namespace=namespace,
                settings=memo.settings,
                kernel_bundle=memo.kernel_bundle,
                surroundings=surroundings,
            )
        except SpecProblem as exc:
            problem = exc
        else:
            # A model cache being (re)filled holds the workload: the one that exists keeps serving the old weights.
            cache = surroundings.model_cache
            filling = observation.spec.model.cache is not None and not (cache is not None and cache.ready)
            held = WORKLOAD_KINDS | {"LeaderWorkerSet"} if filling else set()
            stored_deployment, problem = apply_children(
                api=memo.api, children=children, owner=observation.body, held=held
            )
            memo.metrics.set_children(key, [child["kind"] for child in children])
            cache = surroundings.model_cache
            if problem is None and cache is not None:
                problem = cache.problem  # ModelCacheUnbound, ModelCacheFailed: the rest is applied all the same
            if stored_deployment is not None and any(c["kind"] == "Deployment" for c in children):
                uid = observation.body["metadata"]["uid"]
                cache_sync.prune(api=memo.api, spec=observation.spec, namespace=namespace, name=name, owner_uid=uid)
    if stored_deployment is None:
        uid = observation.body["metadata"]["uid"]
        kind = "StatefulSet" if (observation.body.get("spec") or {}).get("placement") is not None else "Deployment"
        stored_deployment = apply.get_deployment(api=memo.api, namespace=namespace, name=name, owner_uid=uid, kind=kind)

    new = render_status(
        observation,
        deployment=stored_deployment,
        problem=problem,
        adapters=adapters,
        now=wall_clock(),
        placement_short=placement_short,
    )
    stored = observation.body.get("status") or {}
    verdict = problem or _short_verdict(new)
    if verdict is not None and status.degraded_reason(stored) != verdict.reason:
        # Posted here, not through kopf.event: passes run in the queue's workers, outside kopf's handlers.
        when = wall_clock().isoformat().replace("+00:00", "Z")
        event = {"type": "Warning", "reason": verdict.reason, "message": verdict.message}
        apply.post_event(api=memo.api, obj=dict(observation.body), now=when, **event)
    # A merge patch keeps what it does not name: an endpoint withdrawn (a child's name taken) is nulled explicitly.
    withdrawn = {field: None for field in ("endpoint",) if field in stored and field not in new}
    if withdrawn or any(stored.get(field) != value for field, value in new.items()):
        apply.patch_status(
            api=memo.api, plural="modelservers", namespace=namespace, name=name, status={**new, **withdrawn}
        )
    return problem


def write_counts(*, memo: Context, key: ServerKey, adapters: list[AdapterEntry]) -> None:
    """Only `status.adapters`, from the adapters' phases: all that an adapter's phase change alters. One read of the
    server and a status patch when the counts moved, where a whole reconcile reads every kind of child; the rest of
    the status follows the server's own reconciles (its events, its children's, the resync)."""
    namespace, name = key
    server = apply.get_model_server(api=memo.api, namespace=namespace, name=name)
    if server is None:
        return
    counts = status.adapter_counts([entry.phase for entry in adapters]).to_wire()
    if (server.get("status") or {}).get("adapters") != counts:
        apply.patch_status(
            api=memo.api, plural="modelservers", namespace=namespace, name=name, status={"adapters": counts}
        )


def _short_verdict(new_status: Mapping[str, Any]) -> SpecProblem | None:
    """Placement's lack of room, once the status says it (a Warning Event goes with it, as with a spec problem)."""
    for condition in new_status.get("conditions") or []:
        if condition.get("type") == "Degraded" and condition.get("reason") == status.PLACEMENT_SHORT:
            return SpecProblem(status.PLACEMENT_SHORT, str(condition.get("message") or ""))
    return None
