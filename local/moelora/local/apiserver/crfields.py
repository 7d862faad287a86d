"""Field errors as kube-apiserver words them for a custom object (apimachinery pkg/util/validation/field/errors.go,
and errors.NewInvalid for the 422), field paths, and how a node of an updated object finds its old counterpart."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

MISSING: Any = object()  # no old counterpart (a create, or a node that does not correlate)
# apimachinery's field error types (and the reason each is given in a Status cause).
REQUIRED, INVALID, UNSUPPORTED = "FieldValueRequired", "FieldValueInvalid", "FieldValueNotSupported"
FORBIDDEN, TOO_LONG, TOO_MANY = "FieldValueForbidden", "FieldValueTooLong", "FieldValueTooMany"
DUPLICATE, TYPE_INVALID = "FieldValueDuplicate", "FieldValueTypeInvalid"
_TITLES = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    TYPE_INVALID: "Invalid value",
    UNSUPPORTED: "Unsupported value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TOO_MANY: "Too many",
    DUPLICATE: "Duplicate value",
}
BLOCKING = {REQUIRED, UNSUPPORTED, TOO_LONG, TOO_MANY, TYPE_INVALID}
UNCHECKED = (
    "some validation rules were not checked because the object was invalid; correct the existing errors to complete "
    "validation"
)


def go_value(value: Any) -> str:
    """A bad value as ErrorBody prints it: %v for numbers and booleans, %q for strings, %#v for maps and lists, and
    a nil value as null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(key)}:{go_value(value[key])}" for key in sorted(value))
        return "map[string]interface {}{" + inner + "}"
    return "[]interface {}{" + ", ".join(go_value(item) for item in value) + "}"


@dataclasses.dataclass(frozen=True)
class FieldError:
    type: str
    field: str  # "spec.rules[0].matches"; "" for the object itself, printed "<nil>" as the server does
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        text = _TITLES[self.type]
        if self.type not in (REQUIRED, FORBIDDEN, TOO_LONG):
            text += f": {go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field or '<nil>'}: {self.body()}"


def child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def list_key(item: Any, keys: list[str]) -> Any:
    return {key: item.get(key) for key in keys} if isinstance(item, dict) else item


def old_item(old: Any, item: Any, schema: Mapping[str, Any]) -> Any:
    """The old list's item that corresponds to `item` (by its map keys), or MISSING: only list-type map lists
    correlate their items."""
    keys = schema.get("x-kubernetes-list-map-keys")
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return MISSING
    wanted = list_key(item, keys)
    return next((candidate for candidate in old if list_key(candidate, keys) == wanted), MISSING)


def invalid_message(*, kind: str, group: str, name: str, errors: list[FieldError]) -> str:
    """The 422's message: `<Kind>.<group> "<name>" is invalid: <error>`, several errors in brackets."""
    unique = list(dict.fromkeys(str(error) for error in errors))
    listed = unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"
    qualified = f"{kind}.{group}" if group else kind
    return f"{qualified} {json.dumps(name)} is invalid: {listed}"


def invalid_details(*, kind: str, group: str, name: str, errors: list[FieldError]) -> dict[str, Any]:
    """The 422's details: one cause per error, with its reason and field."""
    causes = [{"reason": e.type, "message": e.body(), "field": e.field or "<nil>"} for e in errors]
    return {"name": name, "group": group, "kind": kind, "causes": causes}
