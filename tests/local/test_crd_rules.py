"""The emulator's checks of CustomResourceDefinitions (`crd_rules`, `crd_defaults`): what a real API server refuses.

Each case is a rule of apiextensions-apiserver, with the field path and message it answers with; the emulator used to
store any CRD. The CRDs this project shipped before the fix (reproduced by `old_style`, byte-equal to crds/ at
b1b3bd0) are refused with the messages a real kube-apiserver v1.36 gave for them.
"""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from moelora.api.crd import custom_resource_definitions
from moelora.local.apiserver import KubeAPI
from moelora.local.apiserver.crd_rules import definition_errors
from moelora.local.apiserver.fielderrors import aggregate, go_value

ROOT = pathlib.Path(__file__).resolve().parents[2]
UPSTREAM = ROOT.parent / "shared" / "upstream-crds"
P = "spec.validation.openAPIV3Schema"
OLD_METADATA_DESCRIPTION = "The standard object metadata: name, namespace, labels..."

METADATA_FORBIDDEN = (
    f"{P}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, "
    "but metadata is implicitly specified"
)
KERNELS_DEFAULT = (
    f'{P}.properties[spec].properties[kernels].default: Invalid value: "object": no such key: configs evaluating '
    "rule: configMapName is required when configs is configMap, and only then"
)
# The rule added after b1b3bd0 fails on the same empty default: the server evaluates every rule of a schema node and
# reports each failure (apiextensions-apiserver's CEL validator appends an error per rule and goes on).
KERNELS_INT8_DEFAULT = (
    f'{P}.properties[spec].properties[kernels].default: Invalid value: "object": no such key: expertLoraWeights '
    "evaluating rule: expertLoraWeights int8 needs implementation moelora"
)
GATEWAY_DEFAULT = (
    f'{P}.properties[spec].properties[routing].properties[gateway].default: Invalid value: "object": no such key: '
    "enabled evaluating rule: parentRefs names at least one Gateway when enabled"
)


def old_style(crd: dict[str, Any], *, metadata_description: bool = True) -> dict[str, Any]:
    """A CRD as the generator wrote it before: metadata described, every object default `{}`."""
    crd = copy.deepcopy(crd)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    if metadata_description:
        schema["properties"]["metadata"]["description"] = OLD_METADATA_DESCRIPTION

    def empty_defaults(node: dict[str, Any]) -> None:
        if isinstance(node.get("default"), dict) and "properties" in node:
            node["default"] = {}
        for sub in (node.get("properties") or {}).values():
            empty_defaults(sub)
        if isinstance(node.get("items"), dict):
            empty_defaults(node["items"])

    empty_defaults(schema)
    return crd


def current(plural: str) -> dict[str, Any]:
    return next(crd for crd in custom_resource_definitions() if crd["spec"]["names"]["plural"] == plural)


def widget(schema: dict[str, Any]) -> dict[str, Any]:
    """A minimal CRD with this schema as its one version's."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


def spec_schema(spec: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"metadata": {"type": "object"}, "spec": spec}}


def messages(crd: dict[str, Any]) -> list[str]:
    return [str(error) for error in definition_errors(crd)]


# -- the CRDs we ship, then and now ------------------------------------------------------------------------------------


def test_the_old_crds_are_refused_for_their_metadata_schema_first() -> None:
    """Structural errors hide the defaults' errors, as the server reports them: the metadata alone, for both CRDs."""
    assert messages(old_style(current("modelservers"))) == [METADATA_FORBIDDEN]
    assert messages(old_style(current("loraadapters"))) == [METADATA_FORBIDDEN]


def test_without_the_metadata_description_the_old_defaults_fail_their_own_rules() -> None:
    errors = messages(old_style(current("modelservers"), metadata_description=False))
    assert sorted(errors) == sorted([KERNELS_DEFAULT, KERNELS_INT8_DEFAULT, GATEWAY_DEFAULT])
    assert messages(old_style(current("loraadapters"), metadata_description=False)) == []


@pytest.mark.parametrize("plural", ["modelservers", "loraadapters"])
def test_the_generated_crds_are_accepted(plural: str) -> None:
    assert messages(current(plural)) == []
    on_disk = yaml.safe_load((ROOT / "crds" / f"{plural}.yaml").read_text())
    assert messages(on_disk) == []


def test_generated_metadata_schema_is_its_type_alone() -> None:
    for crd in custom_resource_definitions():
        assert crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"] == {"type": "object"}


def test_the_published_crds_of_the_projects_we_render_for_are_accepted() -> None:
    """No false refusals: CRDs real servers accept (Gateway API, GIE, LWS, KEDA, prometheus-operator) pass."""
    if not UPSTREAM.is_dir():
        pytest.skip(f"{UPSTREAM} is not here")
    crds = [
        doc
        for path in sorted(UPSTREAM.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    assert len(crds) >= 8
    for crd in crds:
        assert messages(crd) == [], crd["metadata"]["name"]


# -- structural schemas (apiextensions-apiserver pkg/apiserver/schema/validation.go) -----------------------------------

OBJ = {"type": "object"}
KEYED = {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}

STRUCTURAL = {
    "metadata with a description": (
        {"type": "object", "properties": {"metadata": {"type": "object", "description": "meta"}}},
        [METADATA_FORBIDDEN],
    ),
    "metadata restricting labels": (
        {"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": OBJ}}}},
        [METADATA_FORBIDDEN],
    ),
    "metadata of another type": (
        {"type": "object", "properties": {"metadata": {"type": "string"}}},
        [f'{P}.properties[metadata].type: Invalid value: "string": must be object'],
    ),
    "a field without a type": (
        spec_schema({"properties": {"a": {"type": "string"}}}),
        [f"{P}.properties[spec].type: Required value: must not be empty for specified object fields"],
    ),
    "array items without a type": (
        spec_schema({"type": "array", "items": {"description": "x"}}),
        [f"{P}.properties[spec].items.type: Required value: must not be empty for specified array items"],
    ),
    "an array without items": (
        spec_schema({"type": "array"}),
        [f"{P}.properties[spec].items: Required value: must be specified"],
    ),
    "a root that is not an object": (
        {"type": "array", "items": {"type": "string"}},
        [f'{P}.type: Invalid value: "array": must be object at the root'],
    ),
    "a root without a type": (
        {"properties": {"spec": OBJ}},
        [f"{P}.type: Required value: must not be empty at the root"],
    ),
    "additionalProperties at the root": (
        {"type": "object", "additionalProperties": {"type": "string"}},
        [f"{P}.additionalProperties: Forbidden: must not be used at the root"],
    ),
    "kind of another type": (
        {"type": "object", "properties": {"kind": {"type": "integer"}}},
        [f'{P}.properties[kind].type: Invalid value: "integer": must be string'],
    ),
    "int-or-string that also preserves unknown fields": (
        spec_schema({"x-kubernetes-int-or-string": True, "x-kubernetes-preserve-unknown-fields": True}),
        [
            f"{P}.properties[spec].x-kubernetes-preserve-unknown-fields: Invalid value: true: "
            "must be false if x-kubernetes-int-or-string is true"
        ],
    ),
    "a type under anyOf": (
        spec_schema({"type": "string", "anyOf": [{"type": "string", "maxLength": 3}, {"minLength": 9}]}),
        [f"{P}.properties[spec].anyOf[0].type: Forbidden: must be empty to be structural"],
    ),
    "a description under allOf": (
        spec_schema({"type": "string", "allOf": [{"description": "no"}]}),
        [f"{P}.properties[spec].allOf[0].description: Forbidden: must be empty to be structural"],
    ),
    "root nullable": (
        {"type": "object", "nullable": True},
        [f"{P}.nullable: Forbidden: nullable cannot be true at the root"],
    ),
    "apiVersion of another type": (
        {"type": "object", "properties": {"apiVersion": {"type": "boolean"}}},
        [f'{P}.properties[apiVersion].type: Invalid value: "boolean": must be string'],
    ),
    "an embedded resource that is a string": (
        spec_schema({"type": "string", "x-kubernetes-embedded-resource": True}),
        [
            f"{P}.properties[spec].properties: Required value: must not be empty if x-kubernetes-embedded-resource "
            "is true without x-kubernetes-preserve-unknown-fields",
            f'{P}.properties[spec].type: Invalid value: "string": must be object if x-kubernetes-embedded-resource '
            "is true",
        ],
    ),
    "an embedded resource with additionalProperties": (
        spec_schema(
            {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "x-kubernetes-preserve-unknown-fields": True,
                "additionalProperties": {"type": "string"},
            }
        ),
        [
            f"{P}.properties[spec].additionalProperties: Forbidden: "
            "must not be used if x-kubernetes-embedded-resource is set"
        ],
    ),
    "int-or-string that is also an embedded resource": (
        spec_schema(
            {
                "type": "object",
                "x-kubernetes-int-or-string": True,
                "x-kubernetes-embedded-resource": True,
                "x-kubernetes-preserve-unknown-fields": True,
            }
        ),
        [
            f"{P}.properties[spec].x-kubernetes-embedded-resource: Invalid value: true: "
            "must be false if x-kubernetes-int-or-string is true",
            f"{P}.properties[spec].x-kubernetes-preserve-unknown-fields: Invalid value: true: "
            "must be false if x-kubernetes-int-or-string is true",
        ],
    ),
    "metadata under anyOf": (
        spec_schema(
            {"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"properties": {"metadata": {}}}]}
        ),
        [f"{P}.properties[spec].anyOf[0].properties[metadata]: Forbidden: must not be specified in a nested context"],
    ),
}

NESTED_FORBIDDEN = {
    "type": ("string", "must be empty to be structural"),
    "additionalProperties": ({"type": "string"}, "must be undefined to be structural"),
    "default": ("x", "must be undefined to be structural"),
    "title": ("T", "must be empty to be structural"),
    "description": ("D", "must be empty to be structural"),
    "nullable": (True, "must be false to be structural"),
    "x-kubernetes-preserve-unknown-fields": (True, "must be false to be structural"),
    "x-kubernetes-embedded-resource": (True, "must be false to be structural"),
    "x-kubernetes-int-or-string": (True, "must be false to be structural"),
    "x-kubernetes-list-map-keys": (["k"], "must be empty to be structural"),
    "x-kubernetes-list-type": ("atomic", "must be undefined to be structural"),
}


@pytest.mark.parametrize("key", sorted(NESTED_FORBIDDEN))
def test_what_a_schema_under_a_junctor_may_not_say(key: str) -> None:
    value, detail = NESTED_FORBIDDEN[key]
    for junctor, under in (("oneOf", [{key: value}]), ("not", {key: value})):
        schema = spec_schema({"type": "string", junctor: under})
        where = f"{P}.properties[spec].{junctor}" + ("[0]" if junctor == "oneOf" else "")
        # The list-type rules of the OpenAPI checks apply under junctors too; the structural refusal is one.
        assert [m for m in messages(widget(schema)) if "Forbidden" in m] == [f"{where}.{key}: Forbidden: {detail}"]


@pytest.mark.parametrize("case", sorted(STRUCTURAL))
def test_structural_rules(case: str) -> None:
    schema, expected = STRUCTURAL[case]
    assert messages(widget(schema)) == expected


def test_structural_schemas_the_server_accepts() -> None:
    accepted = [
        {
            "type": "object",
            "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 9}}}},
        },
        spec_schema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}),
        spec_schema({"x-kubernetes-preserve-unknown-fields": True}),
        spec_schema({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True}),
        {"type": "object", "properties": {"metadata": {"type": "object", "example": {"name": "x"}}}},
    ]
    for schema in accepted:
        assert messages(widget(schema)) == [], schema


def test_structural_errors_come_sorted_and_together() -> None:
    schema = {"type": "object", "properties": {"b": {"description": "no type"}, "a": {"description": "none"}}}
    assert messages(widget(schema)) == [
        f"{P}.properties[a].type: Required value: must not be empty for specified object fields",
        f"{P}.properties[b].type: Required value: must not be empty for specified object fields",
    ]


# -- OpenAPI schema rules (pkg/apis/apiextensions/validation/validation.go) --------------------------------------------

OPENAPI = {
    "properties with an additionalProperties schema": (
        spec_schema({"type": "object", "properties": {"a": OBJ}, "additionalProperties": {"type": "string"}}),
        [
            f"{P}.properties[spec].additionalProperties: Forbidden: "
            "additionalProperties and properties are mutual exclusive"
        ],
    ),
    "uniqueItems": (
        spec_schema({"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        [
            f"{P}.properties[spec].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime "
            "complexity becomes quadratic"
        ],
    ),
    "a $ref": (
        spec_schema({"type": "object", "$ref": "#/definitions/x"}),
        [f"{P}.properties[spec].$ref: Forbidden: $ref is not supported"],
    ),
    "an unknown type": (
        spec_schema({"type": "date"}),
        [
            f'{P}.properties[spec].type: Unsupported value: "date": supported values: "array", "boolean", '
            '"integer", "number", "object", "string"'
        ],
    ),
    "a default in metadata": (
        {"type": "object", "properties": {"metadata": {"type": "object", "default": {"name": "x"}}}},
        [f"{P}.properties[metadata].default: Forbidden: must not be set in top-level metadata"],
    ),
    "a list type on an object": (
        spec_schema({"type": "object", "x-kubernetes-list-type": "set"}),
        [f'{P}.properties[spec].type: Invalid value: "object": must be array if x-kubernetes-list-type is specified'],
    ),
    "a map list without keys": (
        spec_schema({"type": "array", "items": OBJ, "x-kubernetes-list-type": "map"}),
        [
            f"{P}.properties[spec].x-kubernetes-list-map-keys: Required value: "
            "must not be empty if x-kubernetes-list-type is map"
        ],
    ),
    "a rule that is empty": (
        spec_schema({"type": "object", "x-kubernetes-validations": [{"rule": " "}]}),
        [f"{P}.properties[spec].x-kubernetes-validations[0].rule: Required value: rule is not specified"],
    ),
    "properties with additionalProperties false": (
        spec_schema({"type": "object", "properties": {"a": OBJ}, "additionalProperties": False}),
        [
            f"{P}.properties[spec].additionalProperties: Forbidden: "
            "additionalProperties and properties are mutual exclusive"
        ],
    ),
    "type null": (
        spec_schema({"type": "null"}),
        [
            f'{P}.properties[spec].type: Unsupported value: "null": supported values: "array", "boolean", '
            '"integer", "number", "object", "string"',
            f"{P}.properties[spec].type: Forbidden: type cannot be set to null, use nullable as an alternative",
        ],
    ),
    "items as a list": (
        spec_schema({"type": "array", "items": [{"type": "string"}]}),
        [f"{P}.properties[spec].items: Forbidden: items must be a schema object and not an array"],
    ),
    "preserve-unknown-fields false": (
        spec_schema({"type": "object", "x-kubernetes-preserve-unknown-fields": False}),
        [f"{P}.properties[spec].x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined"],
    ),
    "an unknown list type": (
        spec_schema({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "bag"}),
        [
            f'{P}.properties[spec].x-kubernetes-list-type: Unsupported value: "bag": supported values: "atomic", '
            '"set", "map"'
        ],
    ),
    "map keys without a list type": (
        spec_schema({"type": "array", "items": KEYED, "x-kubernetes-list-map-keys": ["k"]}),
        [
            f"{P}.properties[spec].x-kubernetes-list-type: Required value: "
            "must be map if x-kubernetes-list-map-keys is non-empty"
        ],
    ),
    "map keys on a set": (
        spec_schema(
            {"type": "array", "items": KEYED, "x-kubernetes-list-type": "set", "x-kubernetes-list-map-keys": ["k"]}
        ),
        [
            f'{P}.properties[spec].x-kubernetes-list-type: Invalid value: "set": '
            "must be map if x-kubernetes-list-map-keys is non-empty"
        ],
    ),
    "a blank message": (
        spec_schema({"type": "object", "x-kubernetes-validations": [{"rule": "true", "message": "  "}]}),
        [
            f'{P}.properties[spec].x-kubernetes-validations[0].message: Invalid value: "  ": '
            "message must be non-empty if specified"
        ],
    ),
    "a message on two lines": (
        spec_schema({"type": "object", "x-kubernetes-validations": [{"rule": "true", "message": "a\nb"}]}),
        [
            f'{P}.properties[spec].x-kubernetes-validations[0].message: Invalid value: "a\\nb": '
            "message must not contain line breaks"
        ],
    ),
    "a rule on two lines without a message": (
        spec_schema({"type": "object", "x-kubernetes-validations": [{"rule": "true &&\ntrue"}]}),
        [
            f"{P}.properties[spec].x-kubernetes-validations[0].message: Required value: "
            "message must be specified if rule contains line breaks"
        ],
    ),
    "a rule with an unknown reason": (
        spec_schema({"type": "object", "x-kubernetes-validations": [{"rule": "true", "reason": "Nope"}]}),
        [
            f'{P}.properties[spec].x-kubernetes-validations[0].reason: Unsupported value: "Nope": supported values: '
            '"FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"'
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(OPENAPI))
def test_openapi_schema_rules(case: str) -> None:
    schema, expected = OPENAPI[case]
    assert messages(widget(schema)) == expected


@pytest.mark.parametrize("key", ["id", "additionalItems", "patternProperties", "definitions", "dependencies"])
def test_unsupported_json_schema_keywords(key: str) -> None:
    value = "x" if key == "id" else {"a": {"type": "string"}}
    assert messages(widget(spec_schema({"type": "object", key: value}))) == [
        f"{P}.properties[spec].{key}: Forbidden: {key} is not supported"
    ]


# -- defaults (pkg/apiserver/schema/defaulting/validation.go, pkg/apiserver/schema/cel/validation.go) ------------------

SIZE_RULE = {"rule": "self.size < 3", "message": "size is below 3"}
SIZED = {"type": "object", "properties": {"size": {"type": "integer"}}}
TEXT = {"type": "string"}


def ruled(rule: dict[str, Any], default: Any, **properties: Any) -> dict[str, Any]:
    """A spec schema of an object with these properties (an integer `size` if none), one rule, and a default."""
    node = {**SIZED, **({"properties": properties} if properties else {})}
    return spec_schema({**node, "x-kubernetes-validations": [rule], "default": default})


DEFAULTS = {
    "a default with an unknown field": (
        spec_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "default": {"nope": 1}}),
        [f'{P}.properties[spec].default: Invalid value: {{"nope":1}}: must not have unknown fields'],
    ),
    "a default outside the enum": (
        spec_schema({"type": "object", "properties": {"mode": {"type": "string", "enum": ["a", "b"], "default": "c"}}}),
        [f'{P}.properties[spec].properties[mode].default: Unsupported value: "c": supported values: "a", "b"'],
    ),
    "a default without a required field": (
        spec_schema(
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "default": {}}
        ),
        [f"{P}.properties[spec].default.name: Required value"],
    ),
    "a default its rule refuses, with a message": (
        ruled(SIZE_RULE, {"size": 5}),
        [f"{P}.properties[spec].default: Invalid value: size is below 3"],
    ),
    "a scalar default its rule refuses, without a message": (
        spec_schema({"type": "integer", "x-kubernetes-validations": [{"rule": "self < 3"}], "default": 5}),
        [f"{P}.properties[spec].default: Invalid value: 5: failed rule: self < 3"],
    ),
    "a rule with a fieldPath and a reason": (
        ruled({**SIZE_RULE, "fieldPath": ".size", "reason": "FieldValueForbidden"}, {"size": 5}),
        [f"{P}.properties[spec].default.size: Forbidden: size is below 3"],
    ),
    "a rule with a messageExpression": (
        ruled({**SIZE_RULE, "messageExpression": "'size is ' + string(self.size)"}, {"size": 5}),
        [f"{P}.properties[spec].default: Invalid value: size is 5"],
    ),
    "a rule with reason Required": (
        ruled({**SIZE_RULE, "fieldPath": ".size", "reason": "FieldValueRequired"}, {"size": 5}),
        [f"{P}.properties[spec].default.size: Required value: size is below 3"],
    ),
    "a rule with reason Duplicate": (
        ruled({**SIZE_RULE, "reason": "FieldValueDuplicate"}, {"size": 5}),
        [f"{P}.properties[spec].default: Duplicate value"],
    ),
    "a nested rule against the outer default": (
        spec_schema(
            {
                "type": "object",
                "properties": {"inner": {**SIZED, "x-kubernetes-validations": [SIZE_RULE]}},
                "default": {"inner": {"size": 7}},
            }
        ),
        [f"{P}.properties[spec].default.inner: Invalid value: size is below 3"],
    ),
    "a rule reading a field the default leaves out": (
        ruled(SIZE_RULE, {}, size={"type": "integer", "default": 1}),
        [f'{P}.properties[spec].default: Invalid value: "object": no such key: size evaluating rule: size is below 3'],
    ),
    "a rule using the Kubernetes CEL libraries": (
        ruled({"rule": "self.name.lowerAscii() == self.name", "message": "lower case"}, {"name": "ABC"}, name=TEXT),
        [f"{P}.properties[spec].default: Invalid value: lower case"],
    ),
    "a rule reaching a reserved word escaped": (
        ruled({"rule": "self.__namespace__ != 'kube-system'"}, {"namespace": "kube-system"}, namespace=TEXT),
        [f"{P}.properties[spec].default: Invalid value: failed rule: self.__namespace__ != 'kube-system'"],
    ),
    "a rule failing to evaluate otherwise than on a missing key": (
        ruled({"rule": "self.name.charAt(5) == 'x'", "message": "fifth is x"}, {"name": "ab"}, name=TEXT),
        [f'{P}.properties[spec].default: Invalid value: "object": index out of range: 5 evaluating rule: fifth is x'],
    ),
    "a default of an item": (
        spec_schema(
            {
                "type": "array",
                "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'x'"}], "default": "x"},
            }
        ),
        [f"""{P}.properties[spec].items.default: Invalid value: "x": failed rule: self != 'x'"""],
    ),
}


@pytest.mark.parametrize("case", sorted(DEFAULTS))
def test_default_rules(case: str) -> None:
    schema, expected = DEFAULTS[case]
    assert messages(widget(schema)) == expected


def test_defaults_the_server_accepts() -> None:
    accepted = [
        ruled({"rule": "!has(self.size) || self.size < 3"}, {}, size={"type": "integer", "default": 1}),
        ruled({"rule": "self.size == oldSelf.size"}, {"size": 1}),
        spec_schema({"type": "object", "x-kubernetes-preserve-unknown-fields": True, "default": {"any": 1}}),
    ]
    for schema in accepted:
        assert messages(widget(schema)) == [], schema


def test_per_version_schemas_are_checked_at_their_own_paths() -> None:
    crd = widget({"type": "object", "properties": {"metadata": {"type": "object", "description": "meta"}}})
    second = copy.deepcopy(crd["spec"]["versions"][0])
    second.update(name="v2", storage=False, schema={"openAPIV3Schema": {"type": "object"}})
    crd["spec"]["versions"].append(second)
    path = "spec.versions[0].schema.openAPIV3Schema.properties[metadata]"
    assert messages(crd) == [
        f"{path}: Forbidden: must not specify anything other than name and generateName, "
        "but metadata is implicitly specified"
    ]


def test_several_errors_aggregate_as_the_server_prints_them() -> None:
    errors = definition_errors(old_style(current("modelservers"), metadata_description=False))
    text = aggregate(errors)
    assert text.startswith("[") and text.endswith("]") and text.count(", spec.validation") == len(errors) - 1 == 2
    # Objects and arrays print as encoding/json writes them (kubernetes PR #132314), simple values as fmt does.
    assert go_value({"b": [1, "x<y"], "a": None, "c": 2.0}) == '{"a":null,"b":[1,"x\\u003cy"],"c":2}'
    assert [go_value(value) for value in (None, 2.0, 0.5, True, "a<b")] == ["null", "2", "0.5", "true", '"a<b"']


# -- through kubectl, against the emulator -----------------------------------------------------------------------------

EXAMPLES = ROOT / "examples"
CRDS_RESOURCE = "apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        yield api


def _write_old_crds(folder: pathlib.Path, *, metadata_description: bool = True) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for plural in ("modelservers", "loraadapters"):
        crd = old_style(current(plural), metadata_description=metadata_description)
        (folder / f"{plural}.yaml").write_text(yaml.safe_dump(crd, sort_keys=False))
    return folder


def test_kubectl_is_refused_the_old_crds_with_the_servers_messages(kube: KubeAPI, tmp_path: pathlib.Path) -> None:
    old = _write_old_crds(tmp_path / "old")
    for args in (("apply", "--dry-run=server", "-f", str(old)), ("apply", "-f", str(old))):
        refused = kube.kubectl(*args, check=False)
        assert refused.returncode == 1, args
        for plural in ("modelservers", "loraadapters"):  # apply prints the Status message as the server wrote it
            message = f'CustomResourceDefinition.apiextensions.k8s.io "{plural}.moelora.io" is invalid: '
            assert message + METADATA_FORBIDDEN in refused.stderr, args
    for plural in ("modelservers", "loraadapters"):  # create of one object prints kind, name and each cause
        refused = kube.kubectl("create", "-f", str(old / f"{plural}.yaml"), check=False)
        assert refused.returncode == 1
        assert f'The CustomResourceDefinition "{plural}.moelora.io" is invalid: {METADATA_FORBIDDEN}' in refused.stderr
    assert kube.list(CRDS_RESOURCE) == []

    bare = _write_old_crds(tmp_path / "bare", metadata_description=False)
    refused = kube.kubectl("create", "-f", str(bare / "modelservers.yaml"), check=False)
    assert refused.returncode == 1
    assert 'The CustomResourceDefinition "modelservers.moelora.io" is invalid: ' in refused.stderr
    assert KERNELS_DEFAULT in refused.stderr and GATEWAY_DEFAULT in refused.stderr
    assert "created" in kube.kubectl("create", "-f", str(bare / "loraadapters.yaml")).stdout  # no rule to fail


def test_the_crds_pass_a_server_dry_run_that_stores_nothing(kube: KubeAPI, tmp_path: pathlib.Path) -> None:
    dry = kube.kubectl("apply", "--dry-run=server", "-f", str(ROOT / "crds"))
    assert dry.stdout.count("created (server dry run)") == 2
    assert kube.list(CRDS_RESOURCE) == []

    kube.kubectl("apply", "-f", str(ROOT / "crds"))
    stored = {crd["metadata"]["name"]: crd for crd in kube.list(CRDS_RESOURCE)}
    assert sorted(stored) == ["loraadapters.moelora.io", "modelservers.moelora.io"]
    assert kube.kubectl("apply", "--dry-run=server", "-f", str(ROOT / "crds")).stdout.count("unchanged") == 2
    # An update is checked like a create: the old CRDs over the new ones are refused, and nothing changes.
    refused = kube.kubectl("apply", "-f", str(_write_old_crds(tmp_path / "old")), check=False)
    assert refused.returncode == 1 and METADATA_FORBIDDEN in refused.stderr
    kube.kubectl("label", "--dry-run=server", "crd", "modelservers.moelora.io", "tier=dry")
    kube.kubectl("delete", "--dry-run=server", "-f", str(ROOT / "crds"))
    again = kube.kubectl("create", "--dry-run=server", "-f", str(ROOT / "crds" / "modelservers.yaml"), check=False)
    assert again.returncode == 1 and "AlreadyExists" in again.stderr and "already exists" in again.stderr
    assert {crd["metadata"]["name"]: crd for crd in kube.list(CRDS_RESOURCE)} == stored


def test_every_example_passes_a_server_dry_run_once_the_crds_are_installed(kube: KubeAPI) -> None:
    kube.kubectl("apply", "-f", str(ROOT / "crds"))
    files = sorted(EXAMPLES.rglob("*.yaml"))
    assert len(files) >= 11
    for path in files:
        dry = kube.kubectl("apply", "--dry-run=server", "-f", str(path))
        assert "(server dry run)" in dry.stdout, path
    assert kube.list("moelora.io/v1alpha1/modelservers") == [] and kube.list("moelora.io/v1alpha1/loraadapters") == []
