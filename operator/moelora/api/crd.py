"""CustomResourceDefinitions generated from the pydantic models, so the models are the single source of truth.

pydantic writes JSON Schema with `$ref`s, `anyOf [X, null]` for optionals and titles; Kubernetes wants a
*structural* openAPIV3Schema: every node typed, refs inlined, no `anyOf` of types. `structural_schema` does that
conversion, and `custom_resource_definitions` adds what only a CRD has (scope, subresources, printer columns).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from moelora.api.common import GROUP, VERSION
from moelora.api.lora_adapter import LoRAAdapter
from moelora.api.model_server import ModelServer

# Keys of JSON Schema that a structural schema keeps; everything else pydantic writes (title, $defs...) goes.
_KEPT = {
    "type",
    "description",
    "default",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "nullable",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-map-type",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}

# The API server's own fields of every object, described as `kubectl explain` shows them. metadata may say nothing
# but its type: apiextensions refuses a CRD whose metadata schema has anything else (even a description), since the
# server validates metadata itself (apiextensions-apiserver pkg/apiserver/schema/validation.go).
_OBJECT_FIELDS = {
    "apiVersion": {"type": "string", "description": "The API group and version of this object: moelora.io/v1alpha1."},
    "kind": {"type": "string", "description": "The object's kind."},
    "metadata": {"type": "object"},
}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema (camelCase, as serialised) converted into a structural openAPIV3Schema."""
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    definitions = schema.pop("$defs", {})
    return _with_full_defaults(_convert(schema, definitions))


def _with_full_defaults(node: dict[str, Any]) -> dict[str, Any]:
    """The schema with every object default holding its nested defaults, as the server would fill them.

    The API server checks each `default` as written against the x-kubernetes-validations rules of its node, without
    defaulting it first (apiextensions-apiserver pkg/apiserver/schema/defaulting/validation.go), so `{}` fails a
    rule that reads a field the server would default. Filling them in changes nothing for stored objects: the server
    defaults the fields of an applied default as well.
    """
    node = dict(node)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _with_full_defaults(node[key])
    if "properties" in node:
        node["properties"] = {key: _with_full_defaults(sub) for key, sub in node["properties"].items()}
    if isinstance(node.get("default"), dict) and "properties" in node:
        node["default"] = _defaulted(node["default"], node)
    return node


def _defaulted(value: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`value` with the defaults of `node`'s properties added where absent (their own already full)."""
    result = dict(value)
    for key, sub in node["properties"].items():
        if key not in result and "default" in sub:
            result[key] = copy.deepcopy(sub["default"])
        elif isinstance(result.get(key), dict) and "properties" in sub:
            result[key] = _defaulted(result[key], sub)
    return result


def _convert(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:  # inline the definition; sibling keys (description, default) override its own
        target = definitions[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node.pop("allOf")[0], **node}
        return _convert(node, definitions)
    if "anyOf" in node:  # Optional[X]: the API leaves the field out instead of sending null
        options = [option for option in node.pop("anyOf") if option.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"a structural schema cannot express anyOf {options!r}")
        node = {**_convert(options[0], definitions), **{k: v for k, v in node.items() if k != "default"}}
        if "properties" in node:  # a dict typed by the field's own schema: pydantic's free-form must not keep all
            node.pop("x-kubernetes-preserve-unknown-fields", None)
        if node.get("default", ...) is None:
            node.pop("default")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "properties" in node:
        node["properties"] = {key: _convert(value, definitions) for key, value in node["properties"].items()}
        node.setdefault("type", "object")
    if isinstance(node.get("items"), dict):
        node["items"] = _convert(node["items"], definitions)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _convert(node["additionalProperties"], definitions)
    elif node.get("additionalProperties") is True:
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("default") is None:
        node.pop("default", None)
    if not node.get("required", True):
        node.pop("required")
    return {key: value for key, value in node.items() if key in _KEPT}


def _root_schema(model: type[BaseModel], *, name_rule: dict[str, str] | None) -> dict[str, Any]:
    body = structural_schema(model)
    properties = body["properties"]
    properties["status"].pop("required", None)
    schema: dict[str, Any] = {
        "type": "object",
        "description": body.get("description", ""),
        "required": ["spec"],
        "properties": {**_OBJECT_FIELDS, **properties},
    }
    if name_rule:
        schema["x-kubernetes-validations"] = [name_rule]
    return schema


def _crd(
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    schema: dict[str, Any],
    columns: list[dict[str, str]],
    scale: bool,
    selectable: tuple[str, ...] = (),
) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["moelora"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    **({"selectableFields": [{"jsonPath": path} for path in selectable]} if selectable else {}),
                    "additionalPrinterColumns": columns
                    + [
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def model_server_crd() -> dict[str, Any]:
    # The Service and Deployment take the name; the Deployment's pods add up to 11 characters to it.
    name_rule = {
        "rule": "self.metadata.name.size() <= 52 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "message": "name must be a DNS-1035 label of at most 52 characters (it names a Service and pods)",
    }
    return _crd(
        kind="ModelServer",
        plural="modelservers",
        short_names=["ms"],
        scale=True,
        schema=_root_schema(ModelServer, name_rule=name_rule),
        columns=[
            {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
            {"name": "Adapters", "type": "integer", "jsonPath": ".status.adapters.loaded"},
            {"name": "Status", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
        ],
    )


def lora_adapter_crd() -> dict[str, Any]:
    return _crd(
        kind="LoRAAdapter",
        plural="loraadapters",
        short_names=["lora"],
        scale=False,
        # Each server's agents list and watch only their own adapters (fieldSelector, Kubernetes >= 1.31).
        selectable=(".spec.modelServer",),
        schema=_root_schema(LoRAAdapter, name_rule=None),
        columns=[
            {"name": "Server", "type": "string", "jsonPath": ".spec.modelServer"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Loaded", "type": "integer", "jsonPath": ".status.loadedReplicas"},
            {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
            {"name": "Rank", "type": "integer", "jsonPath": ".status.rank"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            # Stale while the operator is away: the phase shown is then older than the pods' own entries.
            {"name": "Rollup", "type": "string", "jsonPath": ".status.rollup"},
        ],
    )


def custom_resource_definitions() -> list[dict[str, Any]]:
    return [model_server_crd(), lora_adapter_crd()]


HEADER = "# Generated from the pydantic models in operator/moelora/api by `python -m moelora.api`. Do not edit.\n"


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a value used twice (an enum shared by two fields) twice: anchors and aliases confuse readers and tools."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_yaml(crd: dict[str, Any]) -> str:
    return HEADER + yaml.dump(crd, Dumper=_NoAliasDumper, sort_keys=False, width=120)
