"""The shared model cache's I/O for a reconcile: read its claim and fill Job (only ours), and delete the caches of
an older source or size once the Deployment no longer needs them. Builders and state are in render/model_cache.py."""

from __future__ import annotations

import datetime
import logging

import kubernetes.client

from moelora.api import ModelServerSpec
from moelora.operator.kube import apply
from moelora.operator.render import model_cache

logger = logging.getLogger(__name__)

CLAIM = ("v1", "PersistentVolumeClaim")
JOB = ("batch/v1", "Job")


def observe(
    *,
    api: kubernetes.client.ApiClient,
    spec: ModelServerSpec,
    namespace: str,
    name: str,
    owner_uid: str,
    now: datetime.datetime,
    unbound_after: float,
) -> model_cache.CacheState | None:
    """The cache's state from its stored claim and Job; None without spec.model.cache. A claim or Job of that name
    that is not ours counts as absent (apply reports the name as taken)."""
    if spec.model.cache is None:
        return None
    found = {
        kind: apply.get_owned(
            api=api, api_version=api_version, kind=kind, namespace=namespace, name=object_name, owner_uid=owner_uid
        )
        for (api_version, kind), object_name in (
            (CLAIM, model_cache.claim_name(spec, server=name)),
            (JOB, model_cache.job_name(spec, server=name)),
        )
    }
    state = model_cache.state(
        spec, server=name, claim=found[CLAIM[1]], job=found[JOB[1]], now=now, unbound_after=unbound_after
    )
    if state.stale_job:  # the reconcile creates it again, for the new claim
        job_name = model_cache.job_name(spec, server=name)
        apply.delete_if_owned(
            api=api, api_version=JOB[0], kind=JOB[1], namespace=namespace, name=job_name, owner_uid=owner_uid
        )
        logger.info("Job %s/%s deleted: its claim was made again", namespace, job_name)
    return state


def prune(
    *, api: kubernetes.client.ApiClient, spec: ModelServerSpec, namespace: str, name: str, owner_uid: str
) -> None:
    """Delete our cache claims and Jobs other than the current one. Call only once the Deployment was applied
    with the current cache (or with none): until then the old claim may be what the pods serve from."""
    keep = set()
    if spec.model.cache is not None:
        keep = {model_cache.claim_name(spec, server=name), model_cache.job_name(spec, server=name)}
    for api_version, kind in (JOB, CLAIM):
        for obj in apply.list_owned(
            api=api,
            api_version=api_version,
            kind=kind,
            namespace=namespace,
            labels={**model_cache.labels(name)},
            owner_uid=owner_uid,
        ):
            object_name = obj["metadata"]["name"]
            if object_name in keep:
                continue
            apply.delete_if_owned(
                api=api, api_version=api_version, kind=kind, namespace=namespace, name=object_name, owner_uid=owner_uid
            )
            logger.info("%s %s/%s deleted (an older model cache)", kind, namespace, object_name)
