"""The only module that talks to the Kubernetes API: reads, status patches, and idempotent create-or-patch of
owned objects.

It writes (patches, deletes) only objects whose controller ownerReference names the ModelServer's uid: an object of
the same name that someone else made is never touched (`NotOwned`), so a ModelServer cannot take over, and through
the garbage collector later delete, a Service or Deployment it did not create.

Each owned object carries the hash of what the operator rendered (`moelora.io/desired-hash`). An unchanged hash on
an object that still holds every field we set means no write at all, so running a reconcile twice never writes
twice. Anything else is a JSON merge patch of the desired object, plus nulls for the optional fields we stopped
setting (merge patches never drop keys by themselves): a new spec, and also a hand edit of a field we own (an image
changed with `kubectl edit`, an env var added), which the Deployment's watch event brings back to us.
"""

from __future__ import annotations

import copy
import hashlib
import json
import urllib.parse
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from moelora.api import GROUP, VERSION
from moelora.operator.render import naming

# Kinds the operator creates -> their collection path (namespace filled in).
_PATHS = {
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{namespace}/deployments",
    ("apps/v1", "StatefulSet"): "/apis/apps/v1/namespaces/{namespace}/statefulsets",
    ("v1", "Service"): "/api/v1/namespaces/{namespace}/services",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{namespace}/configmaps",
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
    ("rbac.authorization.k8s.io/v1", "Role"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
    ),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): (
        "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets"
    ),
    ("inference.networking.k8s.io/v1", "InferencePool"): (
        "/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools"
    ),
    (
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
    ): "/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): (
        "/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
    ),
    ("keda.sh/v1alpha1", "ScaledObject"): "/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects",
    ("v1", "PersistentVolumeClaim"): "/api/v1/namespaces/{namespace}/persistentvolumeclaims",
    ("batch/v1", "Job"): "/apis/batch/v1/namespaces/{namespace}/jobs",
}
# Where pod templates are: a Deployment's, and a LeaderWorkerSet's two.
_TEMPLATES = (
    ("spec", "template"),
    ("spec", "leaderWorkerTemplate", "leaderTemplate"),
    ("spec", "leaderWorkerTemplate", "workerTemplate"),
)
# Kinds whose spec is (mostly) immutable and whose names carry a digest of it (render/model_cache.py): created, never
# patched, so a changed rendering cannot fail every reconcile on a 422.
_CREATE_ONLY = {("v1", "PersistentVolumeClaim"), ("batch/v1", "Job")}
# Optional keys the builders set only sometimes: when the desired object lacks them, the patch removes them.
_OPTIONAL_KEYS: dict[tuple[str, ...], set[str]] = {
    (*template, "spec"): {"initContainers", "nodeSelector", "tolerations", "affinity"} for template in _TEMPLATES
}
# Maps the operator owns whole: keys it no longer sets are removed.
_WHOLE_MAPS = {
    ("data",),
    # A Service's selector, an InferencePool's: a server back on one node must stop asking for leaders only.
    ("spec", "selector"),
    ("spec", "selector", "matchLabels"),
    *((*template, "spec", "nodeSelector") for template in _TEMPLATES),
    *((*template, "spec", "affinity") for template in _TEMPLATES),
    *((*template, "metadata", "annotations") for template in _TEMPLATES),
}


class NotOwned(Exception):
    """An object of the name a child needs exists and is not ours: left as it is."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name} exists and is not owned by this ModelServer")
        self.kind = kind
        self.name = name


def owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    """Whether `obj`'s controller ownerReference names `owner_uid` (a plain, non-controller reference is not enough:
    anyone may add one)."""
    return any(
        ref.get("uid") == owner_uid and ref.get("controller") is True
        for ref in obj.get("metadata", {}).get("ownerReferences") or []
    )


def desired_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def _request(
    api: kubernetes.client.ApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    content_type: str = "application/json",
) -> dict[str, Any]:
    """One call through the client's auth and TLS; raises ApiException for a non-2xx answer."""
    method_, url, headers, body_, post = api.param_serialize(
        method,
        path,
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method_, url, header_params=headers, body=body_, post_params=post, _request_timeout=30)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(http_resp=response)
    return json.loads(data or b"{}")


def _get(api: kubernetes.client.ApiClient, path: str) -> dict[str, Any] | None:
    """The object at `path`, or None on 404."""
    try:
        return _request(api, "GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _object_path(api_version: str, kind: str, *, namespace: str, name: str) -> str:
    return f"{_PATHS[(api_version, kind)].format(namespace=namespace)}/{name}"


def _custom_path(plural: str, *, namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}/{name}"


def get_model_server(*, api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The ModelServer as stored now, or None on 404."""
    return _get(api, _custom_path("modelservers", namespace=namespace, name=name))


def get_pod(*, api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The Pod, or None on 404."""
    return _get(api, f"/api/v1/namespaces/{namespace}/pods/{name}")


def get_config_map(*, api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The ConfigMap, or None on 404."""
    return _get(api, _object_path("v1", "ConfigMap", namespace=namespace, name=name))


def get_deployment(
    *, api: kubernetes.client.ApiClient, namespace: str, name: str, owner_uid: str, kind: str = "Deployment"
) -> dict[str, Any] | None:
    """The Deployment (or StatefulSet) if `owner_uid` controls it; None on 404 or when it is someone else's (whose
    readiness must not become the server's)."""
    found = _get(api, _object_path("apps/v1", kind, namespace=namespace, name=name))
    return found if found is not None and owned_by(found, owner_uid) else None


def get_owned(
    *, api: kubernetes.client.ApiClient, api_version: str, kind: str, namespace: str, name: str, owner_uid: str
) -> dict[str, Any] | None:
    """The object if `owner_uid` controls it; None on 404 or when it is someone else's."""
    found = _get(api, _object_path(api_version, kind, namespace=namespace, name=name))
    return found if found is not None and owned_by(found, owner_uid) else None


def list_owned(
    *,
    api: kubernetes.client.ApiClient,
    api_version: str,
    kind: str,
    namespace: str,
    labels: dict[str, str],
    owner_uid: str | None,
) -> list[dict[str, Any]]:
    """The objects of a kind in `namespace` carrying every label in `labels` that `owner_uid` controls (None: any
    owner; none when the cluster does not serve the kind)."""
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    collection = _PATHS[(api_version, kind)].format(namespace=namespace)
    items = (_get(api, f"{collection}?labelSelector={urllib.parse.quote(selector)}") or {}).get("items") or []
    return [
        item
        for item in items
        if (owner_uid is None or owned_by(item, owner_uid))
        and all((item.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in labels.items())
    ]


def secret_exists(*, api: kubernetes.client.ApiClient, namespace: str, name: str) -> bool | None:
    """Whether the Secret exists; None when the operator may not read Secrets there (403).

    The chart grants no cluster-wide Secret read unless asked (`operator.secretAccess`); then the check is
    skipped, and a missing Secret surfaces as the pods' own SecretNotFound instead. Its data is never kept.
    """
    return _exists(api, f"/api/v1/namespaces/{namespace}/secrets/{name}")


def claim_exists(*, api: kubernetes.client.ApiClient, namespace: str, name: str) -> bool | None:
    """Whether the PersistentVolumeClaim exists; None when the operator may not read claims there (403)."""
    return _exists(api, f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")


def _exists(api: kubernetes.client.ApiClient, path: str) -> bool | None:
    try:
        return _get(api, path) is not None
    except ApiException as exc:
        if exc.status == 403:
            return None
        raise


def post_event(
    *, api: kubernetes.client.ApiClient, obj: dict[str, Any], type: str, reason: str, message: str, now: str
) -> None:
    """A core/v1 Event about `obj` (a ModelServer), from the operator's queue workers, where kopf.event has no queue;
    `now` is an RFC 3339 time. Its "From" is events.COMPONENT's, as kopf's own Events."""
    meta = obj["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": "moelora-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": "moelora-operator",
    }
    _request(api, "POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=body)


def patch_status(
    *, api: kubernetes.client.ApiClient, plural: str, namespace: str, name: str, status: dict[str, Any]
) -> dict[str, Any] | None:
    """Merge-patch the status subresource of a ModelServer or LoRAAdapter (`plural`); the patched object, or None
    on 404 (the object is gone)."""
    path = _custom_path(plural, namespace=namespace, name=name) + "/status"
    try:
        return _request(api, "PATCH", path, body={"status": status}, content_type="application/merge-patch+json")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def create_event(*, api: kubernetes.client.ApiClient, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
    """Create a core v1 Event; the Event as stored (named by the API server from generateName)."""
    return _request(api, "POST", f"/api/v1/namespaces/{namespace}/events", body=event)


def patch_event(
    *, api: kubernetes.client.ApiClient, namespace: str, name: str, patch: dict[str, Any]
) -> dict[str, Any]:
    """Merge-patch a core v1 Event (its count and lastTimestamp); the Event as stored. Raises ApiException 404 when
    it is gone (the API server expires Events)."""
    path = f"/api/v1/namespaces/{namespace}/events/{name}"
    return _request(api, "PATCH", path, body=patch, content_type="application/merge-patch+json")


def delete_if_owned(
    *, api: kubernetes.client.ApiClient, api_version: str, kind: str, namespace: str, name: str, owner_uid: str
) -> bool:
    """Delete the object if `owner_uid` owns it (never someone else's object). True if deleted (or gone meanwhile),
    False if absent or not ours."""
    path = _object_path(api_version, kind, namespace=namespace, name=name)
    obj = _get(api, path)
    if obj is None or not owned_by(obj, owner_uid):
        return False
    if kind == "Job":  # a Job's pods are orphaned by default: take them along
        path += "?propagationPolicy=Background"
    try:
        _request(api, "DELETE", path)
    except ApiException as exc:
        if exc.status != 404:
            raise
    return True


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def update_patch(actual: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that makes `actual` match `desired` in every field the operator owns."""
    patch = copy.deepcopy(desired)
    for path, keys in _OPTIONAL_KEYS.items():
        target, current = _at(patch, path), _at(actual, path)
        if isinstance(target, dict) and isinstance(current, dict):
            for key in keys:
                if key in current and key not in target:
                    target[key] = None
    for path in _WHOLE_MAPS:
        current = _at(actual, path)
        parent = _at(patch, path[:-1])
        if not isinstance(current, dict) or not isinstance(parent, dict):
            continue
        wanted = parent.get(path[-1])
        if wanted is None and path[-1] == "annotations" and path[-1] not in parent:
            wanted = {}  # we set no annotations now: ours from before must still go
        if wanted is None:
            continue  # absent or already nulled above
        if path[-1] == "annotations":  # others annotate pod templates too (kubectl rollout restart): drop only ours
            removed = {key: None for key in current if key.startswith("moelora.io/") and key not in wanted}
        else:
            removed = {key: None for key in current if key not in wanted}
        if wanted or removed:
            parent[path[-1]] = {**wanted, **removed}
    return patch


def drifted(actual: Any, desired: Any) -> bool:
    """Whether `actual` differs from `desired` in a field `desired` sets. Fields only others set (API-server
    defaults, status, foreign labels and annotations) are not compared; lists must match element by element.
    A value the API server rewrites in its canonical form (a quantity "0.5" stored as "500m") reads as drift, and
    costs one no-op patch per reconcile."""
    if isinstance(desired, dict):
        return not isinstance(actual, dict) or any(drifted(actual.get(key), value) for key, value in desired.items())
    if isinstance(desired, list):
        return (
            not isinstance(actual, list)
            or len(actual) != len(desired)
            or any(drifted(a, d) for a, d in zip(actual, desired))
        )
    return actual != desired


def _owned_fields(desired: dict[str, Any]) -> dict[str, Any]:
    """What `drifted` compares: everything rendered except the identity metadata the API server adds to."""
    meta = desired["metadata"]
    return {
        **{key: value for key, value in desired.items() if key != "metadata"},
        "metadata": {key: meta[key] for key in ("labels", "annotations") if key in meta},
    }


def ensure(
    *, api: kubernetes.client.ApiClient, desired: dict[str, Any], owner_uid: str, create: bool = True
) -> tuple[dict[str, Any] | None, str]:
    """Create `desired` or bring the existing object in line. Returns (the object as stored,
    'created'|'patched'|'unchanged'), or (None, 'absent') when it does not exist and `create` is False; raises
    NotOwned, writing nothing, when an object of that name exists whose controller is not `owner_uid`.

    `desired` must already carry its ownerReferences and namespace.
    """
    desired = copy.deepcopy(desired)
    metadata = desired["metadata"]
    metadata.setdefault("annotations", {})[naming.ANNOTATION_HASH] = desired_hash(desired)
    collection = _PATHS[(desired["apiVersion"], desired["kind"])].format(namespace=metadata["namespace"])
    path = f"{collection}/{metadata['name']}"
    actual = _get(api, path)
    if actual is None and not create:
        return None, "absent"
    if actual is None:
        try:
            return _request(api, "POST", collection, body=desired), "created"
        except ApiException as exc:
            if exc.status != 409:
                raise
            actual = _get(api, path)  # created concurrently by another reconcile of the same server
            if actual is None:
                raise
    if not owned_by(actual, owner_uid):
        raise NotOwned(desired["kind"], metadata["name"])
    if (desired["apiVersion"], desired["kind"]) in _CREATE_ONLY:
        return actual, "unchanged"
    same_hash = (actual.get("metadata", {}).get("annotations") or {}).get(naming.ANNOTATION_HASH) == metadata[
        "annotations"
    ][naming.ANNOTATION_HASH]
    if same_hash and not drifted(actual, _owned_fields(desired)):
        return actual, "unchanged"
    patched = _request(
        api, "PATCH", path, body=update_patch(actual, desired), content_type="application/merge-patch+json"
    )
    return patched, "patched"
