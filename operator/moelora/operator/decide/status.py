"""Status, judged from what exists: pure functions of the spec, the Deployment, the pods and the adapters, and the
readers of status others wrote (a pod's readiness, a server's stored conditions).

ModelServer: conditions Ready / Progressing / Degraded from the Deployment and its own conditions, plus the
operator's verdict on the spec. LoRAAdapter: the phase roll-up of docs/architecture.md "Status ownership" from the
per-pod states the agents write; entries of pods that no longer exist are pruned.

ModelServer condition reasons (all conditions carry observedGeneration):

| condition | reason | meaning |
|---|---|---|
| Ready | AllReplicasReady / SomeReplicasReady | all / some of spec.replicas pods are ready (True) |
| Ready | NoReplicasReady, ScaledToZero, DeploymentNotFound | nothing serves (False) |
| Ready | NameTaken | a child's name is someone else's object: True only while pods of ours already serve; no
  status.endpoint, which could name someone else's Service |
| Progressing | Creating, RollingOut (True); RolledOut (False) | the Deployment moving to the current spec, or done |
| Progressing, Degraded | ProgressDeadlineExceeded | the rollout stalled (the Deployment's own verdict) |
| Degraded | FailedCreate (or the Deployment's ReplicaFailure reason) | pods cannot be created (quota, admission) |
| Degraded | PlacementShort | with spec.placement: copies of adapters that no pod has room for (disk budget or
  placement.adaptersPerCpuLora x lora.maxCpuLoras adapters per pod); those adapters run on fewer pods |
| Degraded | AsExpected (False) | nothing to fix |

The operator's verdicts on a spec (Degraded=True and Progressing=False with the same reason, plus one Warning
Event; the running Deployment is left as it was): UnknownEngineFlag, ManagedEngineFlag (engineArgs sets what the
spec sets), EngineArgValue (a value that does not fit its flag), ManagedEnvVar,
SecretNotFound (a Secret the pod needs: spec.s3.credentialsSecret, model.tokenSecret, env or envFrom),
ConfigMapNotFound (kernels.configMapName),
ClaimNotFound (a PersistentVolumeClaim of the user's: a pvc:// model.source or kernels.compileCache),
PodSecurityViolation and InvalidSecurityContext (podSecurityContext or securityContext), ReservedPodLabel,
ReservedPodAnnotation, InvalidTopologySpread,
GPUUnknown (kernels.configs=auto without nvidia.com/gpu.product in nodeSelector), ModelShapeUnknown (auto for a
model id moelora does not know, without kernels.shape), KernelConfigsNotFound (no bundled set for the GPU and the
model's shape), KernelConfigsTooLarge, KernelConfigsInvalid (moelora's kernel table breaks its schema),
InvalidSpec (something the schema let through that the models refuse),
ImageNotAllowed, ServiceAccountNotAllowed (policy.py), NameTaken (a child's name is someone else's object),
SecretGrantForbidden (RBAC refused the adapters' Secret grant), ModelCacheUnbound (the cache's claim is not bound
after model_cache.UNBOUND_AFTER_SECONDS), ModelCacheFailed (its fill Job failed; the Job's message),
ModelCacheLost.

With spec.model.cache: condition ModelCacheReady with reason ModelCachePending / ModelCacheFilling /
ModelCacheReady / ModelCacheFailed (status.modelCache says the same); while no Deployment exists yet, Ready=False
and Progressing=True carry that reason too.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping
from typing import Any

import pydantic

from moelora.api import (
    AdapterCounts,
    AdapterPhase,
    Condition,
    FailureReason,
    LoRAAdapterStatus,
    ModelCachePhase,
    ModelCacheStatus,
    ModelServerSpec,
    ModelServerStatus,
    Rollup,
)
from moelora.api.common import set_condition
from moelora.operator.errors import SpecProblem
from moelora.operator.render import multinode, naming

PLACEMENT_SHORT = "PlacementShort"
NAME_TAKEN = "NameTaken"  # the problem of a child's name held by an object the server does not own


def pod_ready(pod_status: Mapping[str, Any]) -> bool:
    """Whether a pod's status says Ready."""
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod_status.get("conditions") or [])


def stored_server_status(raw_status: Mapping[str, Any]) -> ModelServerStatus:
    """A ModelServer's status as stored; empty when it does not parse (a hand edit), so it is rewritten whole."""
    try:
        return ModelServerStatus.model_validate(dict(raw_status))
    except pydantic.ValidationError:
        return ModelServerStatus()


def degraded_reason(raw_status: Mapping[str, Any]) -> str | None:
    """The reason of a stored Degraded=True condition, None when not degraded."""
    for condition in raw_status.get("conditions") or []:
        if condition.get("type") == "Degraded" and condition.get("status") == "True":
            return str(condition.get("reason"))
    return None


def _deployment_condition(deployment: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def model_server_status(
    spec: ModelServerSpec,
    *,
    name: str,
    namespace: str,
    generation: int | None,
    deployment: Mapping[str, Any] | None,
    problem: SpecProblem | None,
    adapters: AdapterCounts,
    previous: ModelServerStatus,
    now: datetime.datetime,
    model_cache: ModelCacheStatus | None = None,
    placement_short: tuple[int, int] = (0, 0),
) -> ModelServerStatus:
    """The whole ModelServer status. `previous` keeps lastTransitionTime of conditions that did not flip;
    `model_cache`: the shared cache's state (spec.model.cache), which also gives the ModelCacheReady condition;
    `placement_short`: (adapters, copies) placement found no room for."""
    desired = spec.replicas
    dep_status = (deployment or {}).get("status") or {}
    ready = int(dep_status.get("readyReplicas") or 0)
    current = int(dep_status.get("replicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0)
    available = int(dep_status.get("availableReplicas") or 0)

    def cond(kind: str, status: bool, reason: str, message: str) -> Condition:
        return Condition(
            type=kind,
            status="True" if status else "False",
            reason=reason,
            message=message,
            observed_generation=generation,
        )

    # Ready: is anything serving?
    name_taken = problem is not None and problem.reason == NAME_TAKEN
    if problem is not None and name_taken and deployment is not None:  # ours, created before the name was taken
        ready_cond = cond("Ready", ready > 0, NAME_TAKEN, f"{problem.message}; {ready}/{desired} replicas ready")
    elif deployment is None and problem is None and model_cache is not None:
        ready_cond = cond("Ready", False, f"ModelCache{model_cache.phase.value}", model_cache.message)
    elif deployment is None:
        ready_cond = cond(
            "Ready",
            False,
            problem.reason if problem else "DeploymentNotFound",
            problem.message if problem else "the Deployment does not exist yet",
        )
    elif desired == 0:
        ready_cond = cond("Ready", False, "ScaledToZero", "spec.replicas is 0")
    elif ready >= desired:
        ready_cond = cond("Ready", True, "AllReplicasReady", f"{ready}/{desired} replicas ready")
    elif ready > 0:
        ready_cond = cond("Ready", True, "SomeReplicasReady", f"{ready}/{desired} replicas ready")
    else:
        ready_cond = cond("Ready", False, "NoReplicasReady", f"0/{desired} replicas ready")

    # Progressing: is the Deployment moving towards the current spec?
    progress = _deployment_condition(deployment or {}, "Progressing") or {}
    deadline_exceeded = progress.get("reason") == "ProgressDeadlineExceeded"
    dep_meta = (deployment or {}).get("metadata") or {}
    rolled_out = (
        int(dep_status.get("observedGeneration") or 0) >= int(dep_meta.get("generation") or 0)
        and updated >= desired
        and current <= desired
        and available >= desired
    )
    if problem is not None:
        progressing = cond("Progressing", False, problem.reason, "the spec is not applied: " + problem.message)
    elif deployment is None and model_cache is not None and model_cache.phase != ModelCachePhase.READY:
        progressing = cond("Progressing", True, f"ModelCache{model_cache.phase.value}", model_cache.message)
    elif deployment is None:
        progressing = cond("Progressing", True, "Creating", "creating the Deployment")
    elif deadline_exceeded:
        progressing = cond("Progressing", False, "ProgressDeadlineExceeded", str(progress.get("message") or ""))
    elif not rolled_out:
        progressing = cond(
            "Progressing", True, "RollingOut", f"{updated}/{desired} replicas updated, {available} available"
        )
    else:
        progressing = cond("Progressing", False, "RolledOut", "the Deployment runs the current spec")

    # Degraded: does something need a person?
    failure = _deployment_condition(deployment or {}, "ReplicaFailure")
    if problem is not None:
        degraded = cond("Degraded", True, problem.reason, problem.message)
    elif deadline_exceeded:
        degraded = cond("Degraded", True, "ProgressDeadlineExceeded", str(progress.get("message") or ""))
    elif failure is not None and failure.get("status") == "True":
        degraded = cond(
            "Degraded", True, str(failure.get("reason") or "ReplicaFailure"), str(failure.get("message") or "")
        )
    elif placement_short[0]:
        message = (
            f"{placement_short[1]} copies of {placement_short[0]} adapter(s) fit on no pod (disk budget or adapters "
            "per pod): raise replicas, adapterCache.sizeLimit, lora.maxCpuLoras or placement.adaptersPerCpuLora"
        )
        degraded = cond("Degraded", True, PLACEMENT_SHORT, message)
    else:
        degraded = cond("Degraded", False, "AsExpected", "")

    conditions = list(previous.conditions)
    news = [ready_cond, progressing, degraded]
    if model_cache is not None:
        cache_ready = model_cache.phase == ModelCachePhase.READY
        news.append(cond("ModelCacheReady", cache_ready, f"ModelCache{model_cache.phase.value}", model_cache.message))
    else:
        conditions = [c for c in conditions if c.type != "ModelCacheReady"]
    for new in news:
        conditions = set_condition(conditions, new, now=now)
    return ModelServerStatus(
        model_cache=model_cache,
        observed_generation=generation,
        conditions=conditions,
        replicas=current,
        ready_replicas=ready,
        # The scale subresource's selector: an HPA averages its Pods metric over these, the pods serving requests.
        selector=",".join(f"{key}={value}" for key, value in multinode.serving_selector(spec, name=name).items()),
        endpoint=None if name_taken else naming.endpoint(name, namespace),
        adapters=adapters,
    )


def adapter_counts(phases: list[str]) -> AdapterCounts:
    """desired/loaded/failed from the phases of a server's LoRAAdapters."""
    return AdapterCounts(
        desired=len(phases),
        loaded=sum(phase == AdapterPhase.LOADED.value for phase in phases),
        failed=sum(phase == AdapterPhase.FAILED.value for phase in phases),
    )


def adapter_status_patch(
    raw_status: Mapping[str, Any],
    *,
    served_name: str,
    generation: int | None,
    server_exists: bool,
    pods: Mapping[str, bool],
    now: datetime.datetime,
    refused: str | None = None,
    assigned: Collection[str] | None = None,
) -> dict[str, Any]:
    """A merge patch of the operator's share of a LoRAAdapter's status; `pods` maps the server's pod names to ready;
    `refused` says why the operator's policy refuses its source (SourceNotAllowed), the agents refusing it too;
    `assigned` (with placement) the pods that should serve it: only they count, and others' entries are pruned;
    `onDemandLoad` keys of pods that are gone or now assigned it are pruned too.

    `raw_status` is the object's status as stored. Empty when nothing changes (so nothing is written).
    """
    status = LoRAAdapterStatus.model_validate(raw_status or {})
    # On-demand load of a pod that is gone, or that is assigned the adapter now (its entry carries the load), goes.
    stale_load = [pod for pod in status.on_demand_load if pod not in pods or (assigned is not None and pod in assigned)]
    if assigned is not None:
        pods = {pod: ready for pod, ready in pods.items() if pod in assigned}
    gone = [pod for pod in status.replicas if pod not in pods]
    replicas = {pod: state for pod, state in status.replicas.items() if pod in pods}
    ready_pods = [pod for pod, is_ready in pods.items() if is_ready]

    failed = [(pod, state) for pod, state in sorted(replicas.items()) if state.state == AdapterPhase.FAILED]
    if not server_exists:
        phase, reason, message = (
            AdapterPhase.FAILED,
            FailureReason.MODEL_SERVER_NOT_FOUND.value,
            "spec.modelServer names a ModelServer that does not exist in this namespace",
        )
    elif refused is not None:
        phase, reason, message = AdapterPhase.FAILED, FailureReason.SOURCE_NOT_ALLOWED.value, refused
    elif failed:
        pod, state = failed[0]
        phase = AdapterPhase.FAILED
        reason = state.reason or FailureReason.LOAD_FAILED.value
        message = f"{pod}: {state.last_error or reason}"
        # Replicas may disagree (a new pod refuses a version the others refused too but still serve the last good
        # one of): the roll-up says what each of those serves, so Failed is not read as "served nowhere".
        serving = [(pod, state) for pod, state in sorted(replicas.items()) if state.loaded and pod in ready_pods]
        if serving:
            shown = [
                f"{pod} serves {state.version or 'a version'}"
                + (f" (refused {state.rejected_version})" if state.rejected_version else "")
                for pod, state in serving[:5]
            ]
            more = f" and {len(serving) - 5} more" if len(serving) > 5 else ""
            message += f"; still loaded on {len(serving)} of {len(ready_pods)} ready pod(s): {', '.join(shown)}{more}"
    elif ready_pods and all(replicas.get(pod) is not None and replicas[pod].loaded for pod in ready_pods):
        phase, reason, message = AdapterPhase.LOADED, "Loaded", f"loaded on {len(ready_pods)} ready pod(s)"
        # A refused new version leaves the last good one serving: Ready stays True, its reason says what was refused.
        refusing = [(pod, replicas[pod]) for pod in sorted(ready_pods) if replicas[pod].rejected_version]
        if refusing:
            pod, state = refusing[0]
            reason = FailureReason.UPDATE_REJECTED.value
            refused = f"{pod} serves {state.version} and refused {state.rejected_version}: {state.last_error}"
            message = f"{message}; {refused}"
    elif any(state.state == AdapterPhase.DOWNLOADING or state.loaded for state in replicas.values()):
        # Loaded on some pods and still to come on others counts as work in progress too.
        loaded = sum(state.loaded for state in replicas.values())
        phase, reason, message = (
            AdapterPhase.DOWNLOADING,
            "Downloading",
            f"loaded on {loaded} of {len(ready_pods)} ready pod(s)",
        )
        # A retry under way keeps the reason of the attempt before it (an endpoint that hangs, a full cache).
        retrying = [(pod, state) for pod, state in sorted(replicas.items()) if state.reason and not state.loaded]
        if retrying:
            pod, state = retrying[0]
            reason = state.reason or reason
            message = f"{message}; {pod}: {state.last_error or state.reason} (retried)"
    else:
        phase, reason = AdapterPhase.PENDING, "Pending"
        message = "waiting for a ready pod of the server" if not ready_pods else "waiting for the agents"
        # An agent waiting to retry (its endpoint unreachable, its cache full) says why: the roll-up shows it.
        retrying = [(pod, state) for pod, state in sorted(replicas.items()) if state.reason and not state.loaded]
        if retrying:
            pod, state = retrying[0]
            reason, message = state.reason or reason, f"{pod}: {state.last_error or state.reason} (retried)"

    def cond(kind: str, value: bool, why: str, text: str) -> Condition:
        return Condition(
            type=kind, status="True" if value else "False", reason=why, message=text, observed_generation=generation
        )

    conditions = list(status.conditions)
    conditions = set_condition(conditions, cond("Ready", phase == AdapterPhase.LOADED, reason, message), now=now)
    is_failed = phase == AdapterPhase.FAILED
    conditions = set_condition(
        conditions,
        cond("Failed", is_failed, reason if is_failed else "AsExpected", message if is_failed else ""),
        now=now,
    )

    old = raw_status or {}
    new = {
        "observedGeneration": generation,
        "phase": phase.value,
        # What `kubectl get lora` shows as Loaded and Desired: the same ready pods the phase is judged on.
        "loadedReplicas": sum(pod in replicas and replicas[pod].loaded for pod in ready_pods),
        "desiredReplicas": len(ready_pods),
        "servedName": served_name,
        "conditions": [c.to_wire() for c in conditions],
        "rollup": Rollup.CURRENT.value,  # the agents write Stale with each change of their entries
    }
    patch: dict[str, Any] = {key: value for key, value in new.items() if old.get(key) != value}
    if gone:
        patch["replicas"] = {pod: None for pod in gone}
    if patch:
        patch["rolledUpAt"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    if stale_load:
        patch["onDemandLoad"] = dict.fromkeys(stale_load)
    return patch
