"""CEL rules (x-kubernetes-validations), evaluated as kube-apiserver evaluates them (apiextensions-apiserver
pkg/apiserver/schema/cel/validation.go): the one evaluation path for custom objects (`crvalidation`), CRD defaults
(`crd_defaults`) and the short checks of our own CRDs (`schema`).

Each rule runs at the node that declares it, list items and map values included, on non-null values only; a
transition rule (one naming `oldSelf`) only where an old counterpart correlates (same property, map key or list-map
key). A rule that evaluates to false reports, at the node's path plus its `fieldPath` and as its `reason` says
(Invalid by default), its `messageExpression` result, else its `message`, else "failed rule: <rule>"; a rule that
fails to evaluate reports "<error> evaluating rule: <message or rule>", cel-go's words for the error where
cel-python's differ (a missing key is "no such key: <key>"). Objects reach the rules as k8s.io/apiserver
pkg/cel/common/values.go converts them, declared property names escaped as pkg/cel/escaping.go escapes them, with the
Kubernetes CEL libraries (`celib`).
Not emulated: cost budgets, `optionalOldSelf` rules (skipped), rules cel-python cannot parse (skipped; the CRDs we
vendor have none), and warnings instead of errors for ratcheted rules (an unchanged node is not evaluated at all).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator

from moelora.local.apiserver import celib
from moelora.local.apiserver.fielderrors import (
    DUPLICATE,
    FORBIDDEN,
    OMIT,
    REQUIRED,
    FieldError,
    child,
    duplicate,
    forbidden,
    invalid,
    required,
)

MISSING: Any = object()  # no old counterpart (a create, or a node that does not correlate)

# -- objects as CEL sees them (k8s.io/apiserver pkg/cel) ---------------------------------------------------------------

# pkg/cel/escaping.go: CEL's reserved words, and the characters property names may hold.
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
    strings of format date-time as timestamps (pkg/cel/common/values.go)."""
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
    if isinstance(value, int | float):
        if schema.get("type") == "number" or isinstance(value, float):
            return celtypes.DoubleType(value)
        return celtypes.IntType(value)
    if schema.get("format") == "date-time":
        return celtypes.TimestampType(value)
    return celtypes.StringType(value)


# -- old counterparts (pkg/apiserver/schema/cel/validation.go, validateArray and validateMap) -------------------------


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


# -- evaluation, with cel-go's error semantics -------------------------------------------------------------------------


class _GoEvaluator(Evaluator):
    """cel-python's evaluator where an error keeps its own identity as cel-go's does: an erroneous condition of
    `c ? a : b` is the result (cel-python reports a missing overload instead), and of two erroneous operands of
    `||` or `&&` the left one is."""

    def expr(self, tree: Any) -> Any:
        if len(tree.children) == 3:
            condition = self.visit(tree.children[0])
            if isinstance(condition, CELEvalError):
                return condition
        return super().expr(tree)

    def conditionalor(self, tree: Any) -> Any:
        return self._logical(tree, "_||_") if len(tree.children) == 2 else super().conditionalor(tree)

    def conditionaland(self, tree: Any) -> Any:
        return self._logical(tree, "_&&_") if len(tree.children) == 2 else super().conditionaland(tree)

    def _logical(self, tree: Any, name: str) -> Any:
        left, right = self.visit_children(tree)
        if isinstance(left, CELEvalError) and isinstance(right, CELEvalError):
            return left
        try:
            return self.activation.resolve_function(name)(left, right)
        except TypeError as exc:
            return CELEvalError(f"found no matching overload for {name}", exc.__class__, exc.args, tree=tree)


class _Runner(celpy.InterpretedRunner):
    def evaluate(self, context: Any) -> Any:
        return _GoEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


@functools.cache
def compiled(expression: str) -> Any:
    """A CEL expression compiled once (cel-python's parser is slow), with the Kubernetes libraries; raises
    celpy.CELParseError when cel-python cannot parse it."""
    environment = celpy.Environment(runner_class=_Runner)
    return environment.program(environment.compile(expression), functions=celib.FUNCTIONS)


def _program(expression: str) -> Any:
    """The compiled expression, or None when it is empty or cel-python cannot parse it."""
    if not expression.strip():
        return None
    try:
        return compiled(expression.strip())
    except celpy.CELParseError:
        return None


def _error_text(exc: CELEvalError) -> str:
    """An evaluation error in cel-go's words where cel-python's differ: a missing key is `no such key: <key>`."""
    message = str(exc.args[0]) if exc.args else str(exc)
    if found := re.match(r"no such member in mapping: '(.*)'", message):
        return f"no such key: {found.group(1)}"
    if message == "no such key" and len(exc.args) > 2 and exc.args[2]:
        return f"no such key: {exc.args[2][0]}"
    return message


def _uses_old_self(rule: str) -> bool:
    return re.search(r"\boldSelf\b", re.sub(r"'[^']*'|\"[^\"]*\"", "", rule)) is not None


def _message(rule: Mapping[str, Any], bindings: dict[str, Any]) -> str:
    """The messageExpression's result if it is a one-line non-blank string, else ruleMessageOrDefault."""
    if (program := _program(rule.get("messageExpression") or "")) is not None:
        try:
            text = program.evaluate(dict(bindings))
        except CELEvalError:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:
            return text.strip()
    return (rule.get("message") or "").strip() or f"failed rule: {rule['rule'].strip()}"


def _field_path(path: str, relative: str) -> str:
    """`path` with a rule's fieldPath (".a.b", ".a['b.c']", ".a[0]") appended, as a field.Path prints."""
    for name, key, index in re.findall(r"\.([A-Za-z0-9_-]+)|\['([^']*)'\]|\[(\d+)\]", relative):
        path = child(path, name) if name else f"{path}[{key or index}]"
    return path


def _judge(rule: Mapping[str, Any], value: Any, schema: Mapping[str, Any], old: Any) -> tuple[bool, str] | None:
    """None when the rule holds at this node (or cannot be parsed); else (True, the error text) when it failed to
    evaluate, or (False, its message) when it evaluated to anything but true."""
    program = _program(rule["rule"])
    if program is None:
        return None
    bindings = {"self": to_cel(value, schema)}
    if old is not MISSING:
        bindings["oldSelf"] = to_cel(old, schema)
    try:
        result = program.evaluate(bindings)
    except CELEvalError as exc:
        text = (rule.get("message") or "").strip() or rule["rule"].strip()  # ruleErrorString
        return True, f"{_error_text(exc)} evaluating rule: {text}"
    if isinstance(result, celtypes.BoolType) and bool(result):
        return None
    return False, _message(rule, bindings)


def _failure(path: str, rule: Mapping[str, Any], value: Any, kind: str, detail: str) -> FieldError:
    """fieldErrorForReason, with the value as kubernetes PRs #132798 and #133832 (1.35) show it: a string, number or
    boolean as itself, an object's or an array's omitted (a rule that fails to evaluate shows the node's type)."""
    where, reason = _field_path(path, rule.get("fieldPath") or ""), rule.get("reason")
    shown = OMIT if kind in ("object", "array") else value
    if reason == FORBIDDEN:
        return forbidden(where, detail)
    if reason == REQUIRED:
        return required(where, detail)
    if reason == DUPLICATE:
        return duplicate(where, shown)
    return invalid(where, shown, detail)


def cel_errors(
    value: Any,
    schema: Mapping[str, Any],
    path: str = "",
    old: Any = MISSING,
    *,
    ratchet: bool = True,
    verdicts: dict[tuple[int, str], tuple[bool, str] | None] | None = None,
) -> Iterator[FieldError]:
    """Every rule's failure at `value` (at field path `path`) and below, `old` bound as oldSelf where it correlates.
    With `ratchet`, a node equal to its old counterpart is not evaluated (CRDValidationRatcheting). `verdicts`
    remembers each rule's verdict on each value it saw (rules are pure), so a thousand identical nodes cost one
    evaluation."""
    if value is None or (ratchet and old is not MISSING and old == value):
        return
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
        if (verdict := verdicts[key]) is not None:
            failed_to_evaluate, text = verdict
            yield invalid(path, kind, text) if failed_to_evaluate else _failure(path, rule, value, kind, text)
    old_map = old if isinstance(old, dict) else {}
    if isinstance(value, dict):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for name, item in value.items():
            if name in properties:
                where, sub = child(path, name), properties[name]
            elif isinstance(extra, dict):
                where, sub = f"{path}[{name}]", extra
            else:
                continue
            yield from cel_errors(item, sub, where, old_map.get(name, MISSING), ratchet=ratchet, verdicts=verdicts)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        for index, item in enumerate(value):
            old_one = old_item(old, item, schema)
            yield from cel_errors(item, items, f"{path}[{index}]", old_one, ratchet=ratchet, verdicts=verdicts)
