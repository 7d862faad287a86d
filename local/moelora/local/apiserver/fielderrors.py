"""Field errors as the API server words them (apimachinery's pkg/util/validation/field), and the 422 they make.

`FieldError` renders like `field.Error.Error()`: `<path>: <Type string>[: <value>][: <detail>]`; `invalid` turns a
list of them into the `StatusError` of `errors.NewInvalid` (apimachinery pkg/api/errors/errors.go): a message
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

# field.ErrorType -> its String() (apimachinery pkg/util/validation/field/errors.go).
_WORDS = {
    "FieldValueRequired": "Required value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueDuplicate": "Duplicate value",
}
# Types whose ErrorBody never shows the value.
_VALUELESS = {"FieldValueRequired", "FieldValueForbidden"}


class _Omit:
    """field.OmitValueType: an Invalid error that shows no value (CEL rules on objects and arrays)."""

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()


@dataclasses.dataclass(frozen=True)
class FieldError:
    type: str
    field: str
    detail: str = ""
    value: Any = OMIT

    def body(self) -> str:
        """field.Error.ErrorBody: the type's words, the value (Go-formatted) unless omitted, then the detail."""
        text = _WORDS[self.type]
        if self.type not in _VALUELESS and self.value is not OMIT:
            text += ": " + go_value(self.value)
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def required(field: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", field, detail)


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", field, detail)


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", field, detail, value)


def not_supported(field: str, value: Any, supported: Sequence[Any]) -> FieldError:
    """field.NotSupported: each supported value quoted (strconv.Quote of fmt.Sprint)."""
    quoted = ", ".join(go_quote(item if isinstance(item, str) else go_value(item)) for item in supported)
    return FieldError("FieldValueNotSupported", field, f"supported values: {quoted}" if supported else "", value)


def go_quote(text: str) -> str:
    """Go's %q of a string (strconv.Quote), for the printable text these messages hold."""
    return json.dumps(text, ensure_ascii=False)


def go_value(value: Any) -> str:
    """How ErrorBody prints a bad value: %v for numbers and booleans, %q for strings, %#v for the rest."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _go_number(value)
    if isinstance(value, str):
        return go_quote(value)
    return _go_sharp_v(value)


def _go_number(value: float) -> str:
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _go_sharp_v(value: Any) -> str:
    """Go's %#v of a decoded JSON value (map[string]interface {}, []interface {}), map keys sorted as fmt does."""
    if value is None:
        return "interface {}(nil)"
    if isinstance(value, dict):
        inner = ", ".join(f"{go_quote(key)}:{_go_sharp_v(value[key])}" for key in sorted(value))
        return "map[string]interface {}{" + inner + "}"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_sharp_v(item) for item in value) + "}"
    return go_value(value)


def aggregate(errors: Sequence[FieldError]) -> str:
    """ErrorList.ToAggregate().Error(): one error as itself, several as [e1, e2], each distinct message once."""
    messages = list(dict.fromkeys(str(error) for error in errors))
    return messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"


def invalid_error(*, group: str, kind: str, name: str, errors: Sequence[FieldError]) -> kmock.KubernetesError:
    """The 422 Invalid `errors.NewInvalid(schema.GroupKind{group, kind}, name, errors)` answers with."""
    qualified = f"{kind}.{group}" if group else kind
    return kmock.KubernetesError(
        status=422,
        reason="Invalid",
        message=f"{qualified} {go_quote(name)} is invalid: {aggregate(errors)}",
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": error.type, "message": error.body(), "field": error.field} for error in errors],
        },
    )
