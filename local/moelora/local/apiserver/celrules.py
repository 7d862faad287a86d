"""CEL rules (x-kubernetes-validations) of a custom object's schema, evaluated as kube-apiserver does:
apiextensions-apiserver pkg/apiserver/schema/cel/validation.go. Each rule runs at the node that declares it, list
items and map values included; a transition rule (one naming `oldSelf`) only on update, where the old object has
that node; a failure says the rule's `messageExpression` result, else its `message`, else "failed rule: <rule>", at
the node's path plus its `fieldPath`, as its `reason` says (Invalid by default, with the node's type as the bad
value, as released servers print it: kubernetes issue "Improve error messages for CEL validation", seen on 1.32,
proposes the value instead); a rule that fails to evaluate reports "<error> evaluating rule: <message or rule>".
Objects reach the rules as k8s.io/apiserver pkg/cel/common/values.go converts them, declared property names escaped
as pkg/cel/escaping.go escapes them, with the Kubernetes CEL libraries (`celib`).
Not emulated: cost budgets, `optionalOldSelf` rules (skipped).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
from celpy import celtypes

from moelora.local.apiserver import celib
from moelora.local.apiserver.crfields import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    MISSING,
    REQUIRED,
    FieldError,
    child,
    old_item,
)

# k8s.io/apiserver pkg/cel/escaping.go: CEL's reserved words, and the characters property names may hold.
_RESERVED = set(
    "true false null in as break const continue else for function if import let loop package namespace return var "
    "void while".split()
)
_ESCAPES = {"__": "__underscores__", ".": "__dot__", "-": "__dash__", "/": "__slash__"}


def escape(name: str) -> str | None:
    """A property name as CEL rules spell it; None for a name rules cannot reach."""
    if not name or name[0].isdigit():
        return None
    if name in _RESERVED:
        return f"__{name}__"
    if re.search(r"[^a-zA-Z0-9_./-]", name):
        return None
    return re.sub(r"__|[./-]", lambda m: _ESCAPES[m.group(0)], name)


def to_cel(value: Any, schema: Mapping[str, Any]) -> Any:
    """A JSON value as CEL sees it under its schema: declared properties escaped, numbers typed by the schema,
    strings of format date-time as timestamps (k8s.io/apiserver pkg/cel/common/values.go)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, dict):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        result = {}
        for key, item in value.items():
            if key in properties:
                if (escaped := escape(key)) is not None:
                    result[celtypes.StringType(escaped)] = to_cel(item, properties[key])
            else:
                result[celtypes.StringType(key)] = to_cel(item, extra if isinstance(extra, dict) else {})
        return celtypes.MapType(result)
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return celtypes.ListType([to_cel(item, items) for item in value])
    if isinstance(value, (int, float)):
        if schema.get("type") == "number" or isinstance(value, float):
            return celtypes.DoubleType(value)
        return celtypes.IntType(value)
    if schema.get("format") == "date-time":
        return celtypes.TimestampType(value)
    return celtypes.StringType(value)


@functools.cache
def compiled(expression: str) -> Any:
    """A CEL expression compiled once (cel-python's parser is slow), with the Kubernetes libraries."""
    environment = celpy.Environment()
    return environment.program(environment.compile(expression), functions=celib.FUNCTIONS)


def _error_text(exc: Exception) -> str:
    """A CEL evaluation error in cel-go's words where cel-python's differ (a missing key)."""
    message = str(exc.args[0]) if exc.args else str(exc)
    found = re.match(r"no such member in mapping: '(.*)'", message)
    return f"no such key: {found.group(1)}" if found else message


def _uses_old_self(rule: str) -> bool:
    return re.search(r"\boldSelf\b", re.sub(r"'[^']*'|\"[^\"]*\"", "", rule)) is not None


def _message(rule: Mapping[str, Any], bindings: dict[str, Any]) -> str:
    """The rule's messageExpression if it yields a one-line non-blank string, else its message, else the default."""
    if expression := rule.get("messageExpression"):
        try:
            text = compiled(expression).evaluate(bindings)
        except celpy.CELEvalError:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:
            return str(text)
    return rule.get("message") or f"failed rule: {rule['rule']}"


def _field_path(path: str, relative: str) -> str:
    """`path` with a rule's fieldPath (".a.b", ".a['b.c']", ".a[0]") appended, as a field.Path prints."""
    for name, key, index in re.findall(r"\.([A-Za-z0-9_-]+)|\['([^']*)'\]|\[(\d+)\]", relative):
        path = child(path, name) if name else f"{path}[{key or index}]"
    return path


def _judge(rule: Mapping[str, Any], value: Any, schema: Mapping[str, Any], old: Any) -> tuple[bool, str] | None:
    """None when the rule holds at this node; else (True, the error text) when it failed to evaluate, or (False, its
    message) when it evaluated to false."""
    bindings = {"self": to_cel(value, schema)}
    if old is not MISSING:
        bindings["oldSelf"] = to_cel(old, schema)
    try:
        passed = compiled(rule["rule"]).evaluate(bindings)
    except celpy.CELEvalError as exc:
        return True, f"{_error_text(exc)} evaluating rule: {rule.get('message') or rule['rule']}"
    return None if bool(passed) else (False, _message(rule, bindings))


def cel_errors(
    value: Any,
    schema: Mapping[str, Any],
    path: str = "",
    old: Any = MISSING,
    verdicts: dict[tuple[int, str], tuple[bool, str] | None] | None = None,
) -> Iterator[FieldError]:
    """Every x-kubernetes-validations rule's failure, each rule evaluated at its own node. `verdicts` remembers each
    rule's verdict on each value it saw (rules are pure), so a thousand identical nodes cost one evaluation."""
    if old is not MISSING and old == value:
        return  # ratcheting: an unchanged node stays as it was accepted
    verdicts = {} if verdicts is None else verdicts
    kind = schema.get("type", "")
    seen = None
    for rule in schema.get("x-kubernetes-validations") or []:
        transition = _uses_old_self(rule["rule"])
        if (transition and old is MISSING) or rule.get("optionalOldSelf"):
            continue
        if seen is None:
            seen = json.dumps([value, None if old is MISSING else old], sort_keys=True, default=str)
        key = (id(rule), seen)
        if key not in verdicts:
            verdicts[key] = _judge(rule, value, schema, old if transition else MISSING)
        if (verdict := verdicts[key]) is None:
            continue
        failed_to_evaluate, text = verdict
        if failed_to_evaluate:
            yield FieldError(INVALID, path, kind, text)
            continue
        where, reason = _field_path(path, rule.get("fieldPath") or ""), rule.get("reason") or INVALID
        if reason in (FORBIDDEN, REQUIRED):
            yield FieldError(reason, where, detail=text)
        elif reason == DUPLICATE:
            yield FieldError(DUPLICATE, where, kind)
        else:
            yield FieldError(INVALID, where, kind, text)
    old_map = old if isinstance(old, dict) else {}
    if isinstance(value, dict):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for name, item in value.items():
            if name in properties:
                yield from cel_errors(item, properties[name], child(path, name), old_map.get(name, MISSING), verdicts)
            elif isinstance(extra, dict):
                yield from cel_errors(item, extra, f"{path}[{name}]", old_map.get(name, MISSING), verdicts)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from cel_errors(item, schema["items"], f"{path}[{index}]", old_item(old, item, schema), verdicts)
