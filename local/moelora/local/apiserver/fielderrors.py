"""Field errors as kube-apiserver v1.36 words them (apimachinery pkg/util/validation/field/errors.go), the 422 they
make (apimachinery pkg/api/errors/errors.go, NewInvalid), and field paths as field.Path prints them.

`FieldError` renders like `field.Error.Error()`: `<path>: <Type string>[: <value>][: <detail>]`, the path `<nil>`
for the object itself. `invalid_error` turns a list of them into the StatusError of `errors.NewInvalid`: a message
`<Kind>.<group> "<name>" is invalid: <errors>` (one error alone, several as `[e1, e2]`, duplicates once) and one
cause per error, which kubectl prints as `The <Kind> "<name>" is invalid: <field>: <message>`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import kmock

# field.ErrorType values (each also the reason of its Status cause) and their String().
REQUIRED, INVALID, UNSUPPORTED = "FieldValueRequired", "FieldValueInvalid", "FieldValueNotSupported"
FORBIDDEN, TOO_LONG, TOO_MANY = "FieldValueForbidden", "FieldValueTooLong", "FieldValueTooMany"
DUPLICATE, TYPE_INVALID = "FieldValueDuplicate", "FieldValueTypeInvalid"
_WORDS = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    TYPE_INVALID: "Invalid value",
    UNSUPPORTED: "Unsupported value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TOO_MANY: "Too many",
    DUPLICATE: "Duplicate value",
}
_VALUELESS = {REQUIRED, FORBIDDEN, TOO_LONG}  # ErrorBody never prints their value


class _Omit:
    """field.OmitValueType: an error that shows no value (a CEL rule's failure on an object or an array)."""

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()


@dataclasses.dataclass(frozen=True)
class FieldError:
    type: str
    field: str  # "spec.rules[0].matches"; "" for the object itself
    value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        """field.Error.ErrorBody: the type's words, the value unless the type or OMIT hides it, then the detail."""
        text = _WORDS[self.type]
        if self.type not in _VALUELESS and self.value is not OMIT:
            text += ": " + go_value(self.value)
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field or '<nil>'}: {self.body()}"


# -- the constructors of field/errors.go ------------------------------------------------------------------------------


def required(field: str, detail: str = "") -> FieldError:
    return FieldError(REQUIRED, field, detail=detail)


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError(FORBIDDEN, field, detail=detail)


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(INVALID, field, value, detail)


def type_invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(TYPE_INVALID, field, value, detail)


def duplicate(field: str, value: Any) -> FieldError:
    return FieldError(DUPLICATE, field, value)


def not_supported(field: str, value: Any, supported: Sequence[Any]) -> FieldError:
    """field.NotSupported: each supported value quoted (strconv.Quote of fmt.Sprint)."""
    quoted = ", ".join(go_quote(item if isinstance(item, str) else go_value(item)) for item in supported)
    return FieldError(UNSUPPORTED, field, value, f"supported values: {quoted}" if supported else "")


def too_long(field: str, maximum: int) -> FieldError:
    return FieldError(TOO_LONG, field, detail=f"may not be more than {maximum} {'byte' if maximum == 1 else 'bytes'}")


def too_many(field: str, actual: int, maximum: int) -> FieldError:
    return FieldError(TOO_MANY, field, actual, f"must have at most {maximum} {'item' if maximum == 1 else 'items'}")


# -- how a bad value prints --------------------------------------------------------------------------------------------


def go_quote(text: str) -> str:
    """Go's %q of a string (strconv.Quote), for the printable text these messages hold."""
    return json.dumps(text, ensure_ascii=False)


def go_value(value: Any) -> str:
    """How ErrorBody prints a bad value: %v for numbers and booleans, %q for strings, and encoding/json for the rest
    (null, objects with their keys sorted, arrays): the rendering since kubernetes PR #132314 (1.34)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _go_number(value)
    if isinstance(value, str):
        return go_quote(value)
    return _go_json(value)


def _go_number(value: float) -> str:
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _go_json(value: Any) -> str:
    """Go's json.Marshal of a decoded JSON value: compact, map keys sorted, <, > and & escaped as HTML-safe."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_go_json(str(key))}:{_go_json(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_go_json(item) for item in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return go_value(value)


# -- field paths (field.Path) ------------------------------------------------------------------------------------------


def child(path: str, key: str) -> str:
    """Path.Child: `path.key`, or `key` at the root."""
    return f"{path}.{key}" if path else key


# -- the 422 (errors.NewInvalid) ---------------------------------------------------------------------------------------


def aggregate(errors: Sequence[FieldError]) -> str:
    """ErrorList.ToAggregate().Error(): one error as itself, several as [e1, e2], each distinct message once."""
    messages = list(dict.fromkeys(str(error) for error in errors))
    return messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"


def invalid_message(*, kind: str, group: str, name: str, errors: Sequence[FieldError]) -> str:
    """The 422's message: `<Kind>.<group> "<name>" is invalid: <errors>`."""
    qualified = f"{kind}.{group}" if group else kind
    return f"{qualified} {go_quote(name)} is invalid: {aggregate(errors)}"


def invalid_error(*, kind: str, group: str, name: str, errors: Sequence[FieldError]) -> kmock.KubernetesError:
    """The 422 Invalid `errors.NewInvalid(schema.GroupKind{group, kind}, name, errors)` answers with."""
    causes = [{"reason": error.type, "message": error.body(), "field": error.field or "<nil>"} for error in errors]
    return kmock.KubernetesError(
        status=422,
        reason="Invalid",
        message=invalid_message(kind=kind, group=group, name=name, errors=errors),
        details={"name": name, "group": group, "kind": kind, "causes": causes},
    )
