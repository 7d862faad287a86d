"""How the emulator admits a custom object of a CRD loaded as published: each step kube-apiserver takes (pruning,
nulls, defaults, the schema, CEL rules at every node, transition rules, messages) shown on a small schema, with the
messages the server writes (field errors from apimachinery's field/errors.go, rule errors from apiextensions'
schema/cel/validation.go)."""

from __future__ import annotations

import copy
from typing import Any

from moelora.local.apiserver import celrules, crvalidation, fielderrors
from moelora.local.apiserver.fielderrors import DUPLICATE

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["size"],
            "x-kubernetes-validations": [
                {"rule": "self.size <= self.limit", "message": "size may not exceed limit"},
                {
                    "rule": "has(self.__namespace__) ? self.__namespace__ != 'kube-system' : true",
                    "reason": "FieldValueForbidden",
                    "message": "not kube-system",
                },
            ],
            "properties": {
                "size": {"type": "integer", "minimum": 1},
                "limit": {"type": "integer", "default": 8},
                "namespace": {"type": "string"},
                "mode": {"type": "string", "enum": ["Fast", "Slow"]},
                "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "weight": {"type": "integer", "default": 1}},
                        "x-kubernetes-validations": [
                            {
                                "rule": "self.weight > 0",
                                "messageExpression": "'weight of ' + self.name + ' is not positive'",
                            }
                        ],
                    },
                },
                "labels": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "string",
                        "x-kubernetes-validations": [{"rule": "self.size() < 4"}],
                    },
                },
                "frozen": {
                    "type": "string",
                    "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "frozen is immutable"}],
                },
                "pair": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "x-kubernetes-validations": [{"rule": "self.a < self.b", "fieldPath": ".b", "message": "b > a"}],
                },
            },
        },
    },
}


def obj(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "x.io/v1", "kind": "Thing", "metadata": {"name": "t", "labels": {"a": "b"}}, "spec": spec}


def errors(thing: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return [str(error) for error in crvalidation.admit(copy.deepcopy(thing), SCHEMA, old)]


def test_a_valid_object_is_stored_pruned_and_defaulted() -> None:
    thing = obj(size=2, unknown=1, items=[{"name": "a"}])
    assert crvalidation.admit(thing, SCHEMA) == []
    assert thing["spec"] == {"size": 2, "limit": 8, "items": [{"name": "a", "weight": 1}]}
    assert thing["metadata"] == {"name": "t", "labels": {"a": "b"}}  # ObjectMeta is not the schema's to prune


def test_rules_see_defaults_applied_first() -> None:
    assert errors(obj(size=9)) == ["spec: Invalid value: size may not exceed limit"]
    assert errors(obj(size=9, limit=10)) == []


def test_nulls_of_fields_not_nullable_are_dropped_then_defaulted() -> None:
    thing = obj(size=2, limit=None)
    assert crvalidation.admit(thing, SCHEMA) == [] and thing["spec"]["limit"] == 8


def test_schema_errors_in_the_servers_words() -> None:
    assert errors(obj(size=0, mode="Quick", name="TOOLONG")) == [
        "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1",
        'spec.mode: Unsupported value: "Quick": supported values: "Fast", "Slow"',
        "spec.name: Too long: may not be more than 5 bytes",
        "spec.name: Invalid value: \"TOOLONG\": spec.name in body should match '^[a-z]+$'",
        "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; "
        "correct the existing errors to complete validation",
    ]
    assert errors(obj(limit=1)) == [
        "spec.size: Required value",
        "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; "
        "correct the existing errors to complete validation",
    ]
    assert errors(obj(size="two"))[0] == (
        'spec.size: Invalid value: "string": spec.size in body must be of type integer: "string"'
    )


def test_a_non_blocking_schema_error_still_lets_the_rules_run() -> None:
    # A pattern failure is an Invalid value, not one of the blocking kinds: the rules are evaluated too.
    assert errors(obj(size=9, name="AB")) == [
        "spec.name: Invalid value: \"AB\": spec.name in body should match '^[a-z]+$'",
        "spec: Invalid value: size may not exceed limit",
    ]


def test_lists_count_items_and_keys() -> None:
    many = [{"name": str(n)} for n in range(4)]
    assert errors(obj(size=1, items=many))[0] == "spec.items: Too many: 4: must have at most 3 items"
    assert errors(obj(size=1, items=[{"name": "a"}, {"name": "a"}])) == ['spec.items[1]: Duplicate value: {"name":"a"}']


def test_rules_run_on_list_items_and_map_values_with_their_paths() -> None:
    assert errors(obj(size=1, items=[{"name": "a"}, {"name": "b", "weight": 0}], labels={"x": "ok", "y": "long"})) == [
        "spec.items[1]: Invalid value: weight of b is not positive",  # messageExpression; an object's value omitted
        'spec.labels[y]: Invalid value: "long": failed rule: self.size() < 4',  # no message: the rule; a string shown
    ]


def test_field_path_and_reason_shape_the_error() -> None:
    assert errors(obj(size=1, pair={"a": 2, "b": 1})) == ["spec.pair.b: Invalid value: b > a"]
    assert errors(obj(size=1, namespace="kube-system")) == ["spec: Forbidden: not kube-system"]


def test_reserved_words_are_reached_escaped() -> None:
    # The rule spells `namespace` as `__namespace__` (k8s.io/apiserver pkg/cel/escaping.go); without the escaping,
    # has() would be false and the rule would pass.
    assert celrules.escape("namespace") == "__namespace__"
    assert celrules.escape("x-y.z/w") == "x__dash__y__dot__z__slash__w"
    assert celrules.escape("a__b") == "a__underscores__b"
    assert celrules.escape("1st") is None
    assert errors(obj(size=1, namespace="team")) == []


def test_transition_rules_wait_for_an_update() -> None:
    created = obj(size=1, frozen="a")
    assert errors(created) == []  # oldSelf: not evaluated on create
    stored = copy.deepcopy(created)
    crvalidation.admit(stored, SCHEMA)
    assert errors(obj(size=1, frozen="b"), old=stored) == ['spec.frozen: Invalid value: "b": frozen is immutable']
    assert errors(obj(size=1, frozen="a", limit=3), old=stored) == []


def test_an_unchanged_invalid_value_is_ratcheted_on_update() -> None:
    stored = obj(size=9, limit=8)  # invalid now (say, accepted by an older CRD)
    assert errors(obj(size=9, limit=8, mode="Fast"), old=stored) == ["spec: Invalid value: size may not exceed limit"]
    labels = obj(size=1, labels={"y": "long"})
    assert errors(obj(size=1, labels={"y": "long"}, mode="Fast"), old=labels) == []  # the map value did not change


def test_a_rule_that_cannot_evaluate_says_so() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "x-kubernetes-validations": [{"rule": "self.b == 1", "message": "b is one"}]}
        },
    }
    found = crvalidation.admit({"a": {}}, schema)
    assert [str(e) for e in found] == ['a: Invalid value: "object": no such key: b evaluating rule: b is one']


def test_a_failed_rule_shows_a_simple_value_and_omits_an_object_or_an_array() -> None:
    """kube-apiserver since 1.35 (kubernetes PRs #132798, #133832): a rule that evaluates to false reports a string,
    number or boolean as itself and omits an object's or an array's value, whatever its reason; messages trimmed."""
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "x-kubernetes-validations": [{"rule": "self < 3", "message": " under 3 "}]},
            "tag": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'x'", "reason": DUPLICATE}]},
            "tags": {
                "type": "array",
                "items": {"type": "string"},
                "maxItems": 1,
                "x-kubernetes-validations": [{"rule": "self.all(t, t != 'x')", "reason": DUPLICATE}],
            },
        },
    }
    assert [str(e) for e in crvalidation.admit({"count": 5, "tag": "x", "tags": ["x"]}, schema)] == [
        "count: Invalid value: 5: under 3",
        'tag: Duplicate value: "x"',
        "tags: Duplicate value",
    ]
    assert [str(e) for e in crvalidation.admit({"tags": ["a", "b"]}, schema)][0] == (
        "tags: Too many: 2: must have at most 1 item"  # field.TooMany's singular
    )


def test_an_error_keeps_its_identity_through_logical_operators() -> None:
    """cel-go's `a || b` with both sides erroneous is the left error, not a missing overload as in cel-python."""
    rule = {"rule": "(self.missing ? true : true) || self.other == 1", "message": "m"}
    schema = {"type": "object", "properties": {"gate": {"type": "object", "x-kubernetes-validations": [rule]}}}
    found = crvalidation.admit({"gate": {}}, schema)
    assert [str(e) for e in found] == ['gate: Invalid value: "object": no such key: missing evaluating rule: m']


def test_the_status_message_and_causes() -> None:
    found = crvalidation.admit(obj(size=9, mode="Quick"), SCHEMA)
    refusal = fielderrors.invalid_error(kind="Thing", group="x.io", name="t", errors=found)
    assert refusal.status == 422 and refusal.reason == "Invalid"
    assert refusal.message.startswith('Thing.x.io "t" is invalid: [spec.mode: Unsupported value: "Quick": ')
    details = refusal.details
    assert details["causes"][-1] == {
        "reason": "FieldValueInvalid",
        "message": f"Invalid value: null: {crvalidation.UNCHECKED}",
        "field": "<nil>",
    }
    assert details["causes"][0] == {
        "reason": "FieldValueNotSupported",
        "message": 'Unsupported value: "Quick": supported values: "Fast", "Slow"',
        "field": "spec.mode",
    }
