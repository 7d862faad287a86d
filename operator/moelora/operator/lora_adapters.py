"""LoRAAdapter handlers: the operator's share of an adapter's status, rolled up from the per-pod states its server's
agents write, whenever the adapter, a server pod, or the server changes.

A phase change also reconciles the server at once, so its adapter counts follow without waiting for a resync.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes.client
import pydantic

from moelora.api import AdapterSource, S3Spec
from moelora.operator import apply, indexes, naming, policy, status
from moelora.operator.context import Context, ServerKey, wall_clock
from moelora.operator.indexes import AdapterEntry
from moelora.operator.model_servers import reconcile_serially


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """A LoRAAdapter as stored, with what its phase is judged from."""

    body: Mapping[str, Any]
    server_exists: bool
    pods: Mapping[str, bool]  # the server's pods -> ready
    refused: str | None = None  # why policy refuses its source (SourceNotAllowed)


def observe_pods(
    *, api: kubernetes.client.ApiClient, body: Mapping[str, Any], known: Mapping[str, bool]
) -> dict[str, bool]:
    """The server's pods -> ready: the index's, plus each pod the adapter's status names that the index lacks but
    the API server still has (its watch may lag the pod's agent: such a pod is not gone, so not pruned)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    pods = dict(known)
    for pod in set((body.get("status") or {}).get("replicas") or {}) - set(pods):
        found = apply.get_pod(api=api, namespace=meta["namespace"], name=pod)
        if found is not None and (found["metadata"].get("labels") or {}).get(naming.LABEL_SERVER) == spec.get(
            "modelServer"
        ):
            pods[pod] = status.pod_ready(found.get("status") or {})
    return pods


def render_status_patch(observation: Observation, *, now: datetime.datetime) -> dict[str, Any]:
    """The merge patch of the operator's share of the status; empty when nothing changes."""
    meta, spec = observation.body["metadata"], observation.body.get("spec") or {}
    return status.adapter_status_patch(
        dict(observation.body.get("status") or {}),
        served_name=spec.get("servedName") or meta["name"],
        generation=meta.get("generation"),
        server_exists=observation.server_exists,
        pods=observation.pods,
        now=now,
        refused=observation.refused,
        assigned=((observation.body.get("status") or {}).get("placement") or {}).get("replicas"),
    )


def source_refusal(*, memo: Context, body: Mapping[str, Any]) -> str | None:
    """Why policy refuses the adapter's source, judged with its server's endpoint; None when allowed, or when the
    spec or the server cannot be read (other reasons report those)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    server = apply.get_model_server(api=memo.api, namespace=meta["namespace"], name=spec.get("modelServer", ""))
    try:
        source = AdapterSource.model_validate(spec.get("source") or {})
        server_s3 = S3Spec.model_validate(((server or {}).get("spec") or {}).get("s3") or {})
    except pydantic.ValidationError:
        return None
    if server is None:
        return None
    return policy.adapter_source_problem(source, server_endpoint=server_s3.endpoint_url, settings=memo.settings)


def rollup_adapter(
    *, memo: Context, body: Mapping[str, Any], server_exists: bool, pods: Mapping[str, bool]
) -> str | None:
    """Write the operator's share of one adapter's status if it changed. The new phase if the phase changed."""
    observed_pods = observe_pods(api=memo.api, body=body, known=pods)
    refused = source_refusal(memo=memo, body=body) if server_exists else None
    observation = Observation(body=body, server_exists=server_exists, pods=observed_pods, refused=refused)
    patch = render_status_patch(observation, now=wall_clock())
    if not patch:
        return None
    meta = body["metadata"]
    apply.patch_status(
        api=memo.api, plural="loraadapters", namespace=meta["namespace"], name=meta["name"], status=patch
    )
    return patch.get("phase")


def rollup_server_adapters(
    *, memo: Context, namespace: str, adapters: list[AdapterEntry], server_exists: bool, pods: Mapping[str, bool]
) -> dict[str, str]:
    """Re-judge every adapter of one server; the new phase of each whose phase changed."""
    new_phases = {}
    for entry in adapters:
        body = apply.get_lora_adapter(api=memo.api, namespace=namespace, name=entry.name)
        if body is not None:
            phase = rollup_adapter(memo=memo, body=body, server_exists=server_exists, pods=pods)
            if phase:
                new_phases[entry.name] = phase
    return new_phases


async def recount(
    *,
    memo: Context,
    key: ServerKey,
    servers: list[ServerKey],
    adapters_index: indexes.AdaptersIndex,
    new_phases: Mapping[str, str],
) -> None:
    """Reconcile the servers whose adapters just changed phase, so their adapter counts follow at once (with the
    new phases already: see indexes.adapter_phases)."""
    if not new_phases:
        return
    memo.written_phases[key].update(new_phases)
    for server in servers:
        await reconcile_serially(memo=memo, key=server, adapters_index=adapters_index)


async def _rejudge_server_adapters(
    *,
    memo: Context,
    key: ServerKey,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
) -> None:
    servers = indexes.servers(model_servers_index, key)
    new_phases = await memo.call(
        rollup_server_adapters,
        memo=memo,
        namespace=key[0],
        adapters=indexes.adapters(adapters_index, key),
        server_exists=bool(servers),
        pods=indexes.pods(pods_index, key),
    )
    await recount(memo=memo, key=key, servers=servers, adapters_index=adapters_index, new_phases=new_phases)


async def regrant_secrets(
    *, memo: Context, namespace: str, servers_index: indexes.ServersIndex, adapters_index: indexes.AdaptersIndex
) -> None:
    """Reconcile the servers of the namespace whose adapters now name other Secrets than their Role grants (an
    adapter added, deleted, moved to another server, or naming another Secret), so the Role follows at once."""
    for key in [key for key in servers_index if key[0] == namespace]:
        wanted = indexes.adapter_secrets(indexes.adapters(adapters_index, key))
        if wanted != memo.granted_secrets.get(key, frozenset()):
            await reconcile_serially(memo=memo, key=key, adapters_index=adapters_index)


async def adapter_changed(
    body: kopf.Body,
    namespace: str,
    spec: kopf.Spec,
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
    **_: Any,
) -> None:
    key = (namespace, spec.get("modelServer", ""))
    servers = indexes.servers(model_servers_index, key)
    await regrant_secrets(
        memo=memo, namespace=namespace, servers_index=model_servers_index, adapters_index=adapters_index
    )
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    new_phase = await memo.call(
        rollup_adapter, memo=memo, body=dict(body), server_exists=bool(servers), pods=indexes.pods(pods_index, key)
    )
    if new_phase:
        new_phases = {body["metadata"]["name"]: new_phase}
        await recount(memo=memo, key=key, servers=servers, adapters_index=adapters_index, new_phases=new_phases)


async def pod_event(
    labels: kopf.Labels,
    namespace: str,
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
    **_: Any,
) -> None:
    """A server pod came, went, or changed readiness: re-judge its server's adapters (and prune gone pods)."""
    await _rejudge_server_adapters(
        memo=memo,
        key=(namespace, labels.get(naming.LABEL_SERVER, "")),
        model_servers_index=model_servers_index,
        adapters_index=adapters_index,
        pods_index=pods_index,
    )


async def model_server_event(
    event: kopf.RawEvent,
    name: str,
    namespace: str,
    memo: Context,
    model_servers_index: indexes.ServersIndex,
    adapters_index: indexes.AdaptersIndex,
    pods_index: indexes.PodsIndex,
    **_: Any,
) -> None:
    """A server appeared or went away: its adapters' phases may flip (ModelServerNotFound)."""
    if event.get("type") in ("ADDED", "DELETED", None):
        await _rejudge_server_adapters(
            memo=memo,
            key=(namespace, name),
            model_servers_index=model_servers_index,
            adapters_index=adapters_index,
            pods_index=pods_index,
        )
