"""A ModelServer at the schema's maxima still fits: kopf keeps a copy of its spec in an annotation (the last-handled
configuration), kubectl apply another, and Kubernetes refuses an object whose annotations exceed 256 KiB. So every
field of the spec needs a maximum (maxLength, maxItems, maxProperties, or an enum), and the largest spec they allow
must fit twice into the annotations with room to spare."""

from __future__ import annotations

import json
from typing import Any

import kopf

from moelora.api.crd import model_server_crd
from moelora.api.scheduling import LABEL_KEY
from moelora.operator.control.wiring import kopf_settings

ANNOTATIONS_LIMIT = 256 * 1024  # Kubernetes' limit on the total size of an object's annotations
INT64_DIGITS = 20


def worst_case(node: dict[str, Any], path: str, unbounded: list[str]) -> Any:
    """The largest value the schema node allows when serialised as JSON; unbounded paths are collected."""
    kind = node.get("type")
    if "enum" in node:
        return max((value for value in node["enum"]), key=lambda value: len(json.dumps(value)))
    if kind == "object" and "properties" in node:
        return {key: worst_case(sub, f"{path}.{key}", unbounded) for key, sub in node["properties"].items()}
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        rules = " ".join(rule["rule"] for rule in node.get("x-kubernetes-validations") or [])
        if "maxProperties" not in node or f"k.size() <= {LABEL_KEY}" not in rules:
            unbounded.append(f"{path} (maxProperties and a key length rule)")
            return {}
        value = worst_case(node["additionalProperties"], f"{path}{{}}", unbounded)
        return {f"{index:03d}".ljust(LABEL_KEY, "k"): value for index in range(node["maxProperties"])}
    if kind == "object":
        unbounded.append(f"{path} (a free-form object)")
        return {}
    if kind == "array":
        if "maxItems" not in node:
            unbounded.append(f"{path} (maxItems)")
            return []
        return [worst_case(node["items"], f"{path}[]", unbounded)] * node["maxItems"]
    if kind == "string":
        if node.get("format") == "date-time":
            return "2026-01-01T00:00:00Z"
        if "maxLength" not in node:
            unbounded.append(f"{path} (maxLength)")
            return ""
        return "x" * node["maxLength"]
    if kind == "integer":
        bounds = [node[key] for key in ("minimum", "maximum") if key in node]
        return max(bounds, key=lambda value: len(str(value))) if len(bounds) == 2 else -(10 ** (INT64_DIGITS - 2))
    if kind == "boolean":
        return False
    unbounded.append(f"{path} (type {kind})")
    return None


def largest_model_server() -> tuple[dict[str, Any], list[str]]:
    schema = model_server_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    unbounded: list[str] = []
    spec = worst_case(schema["properties"]["spec"], "spec", unbounded)
    body = {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "m" * 52, "namespace": "n" * 63, "uid": "0" * 36, "resourceVersion": "9" * 12},
        "spec": spec,
    }
    return body, unbounded


def size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


def test_every_spec_field_has_a_maximum() -> None:
    _, unbounded = largest_model_server()
    assert unbounded == []


def test_the_largest_model_server_fits_with_kopfs_and_kubectls_copies() -> None:
    body, _ = largest_model_server()
    storage = kopf_settings(namespaces=()).persistence.diffbase_storage
    essence = storage.build(body=kopf.Body(body))
    patch = kopf.Patch()
    storage.store(body=kopf.Body(body), patch=patch, essence=essence)
    kopf_annotations = dict(patch["metadata"]["annotations"])
    kubectl = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(body, separators=(",", ":"))}
    annotations = {**kopf_annotations, **kubectl}
    annotations_size = sum(len(key) + len(value) for key, value in annotations.items())
    assert annotations_size < ANNOTATIONS_LIMIT * 0.9, annotations_size
    # The stored object itself, with kopf's annotations, stays under the same figure the brief set for it.
    stored = {**body, "metadata": {**body["metadata"], "annotations": kopf_annotations}}
    assert size(stored) < ANNOTATIONS_LIMIT * 0.9, size(stored)


def test_the_checks_can_fail() -> None:
    unbounded: list[str] = []
    worst_case({"type": "object", "additionalProperties": {"type": "string"}}, "m", unbounded)
    worst_case({"type": "array", "items": {"type": "string", "maxLength": 1}}, "a", unbounded)
    worst_case({"type": "string", "pattern": "^x$"}, "s", unbounded)
    assert unbounded == ["m (maxProperties and a key length rule)", "a (maxItems)", "s (maxLength)"]


def test_map_keys_past_the_limit_are_refused_by_the_crds_rule() -> None:
    from moelora.local.apiserver import apply_defaults, schema_errors

    schema = model_server_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def errors(node_selector: dict[str, str]) -> list[str]:
        obj = {
            "apiVersion": "moelora.io/v1alpha1",
            "kind": "ModelServer",
            "metadata": {"name": "m"},
            "spec": {"model": {"name": "org/m"}, "nodeSelector": node_selector, "resources": {"limits": {"cpu": "1"}}},
        }
        return schema_errors(apply_defaults(obj, schema), schema)

    assert errors({"k" * LABEL_KEY: "v"}) == []
    assert any("317" in error for error in errors({"k" * (LABEL_KEY + 1): "v"}))
    assert any("maxProperties" in error or "too many" in error for error in errors({f"k{i}": "v" for i in range(9)}))
