"""The API server's checks of each `default` in a CRD's schema, as apiextensions-apiserver makes them.

apiextensions-apiserver pkg/apiserver/schema/defaulting/validation.go (`validate`) walks the schema through
`properties` and `items` (never `additionalProperties`, where defaults are forbidden) and, at each node with a non-null
default: refuses one with fields the node would prune ("must not have unknown fields"); validates it against the
node's schema; and only if that passes evaluates the x-kubernetes-validations rules of the node and of the nodes
below it against the default AS WRITTEN (nested defaults are not filled in first), with the default as oldSelf too.
CEL failures are worded as pkg/apiserver/schema/cel/validation.go words them.
Not emulated: defaults inside embedded resources' metadata, the CEL cost budget, and CEL errors cel-python cannot
reproduce faithfully (only cel-go's "no such key" evaluation error is reported; rules cel-python cannot compile, such
as those using Kubernetes' CEL libraries, are skipped rather than refused).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
import jsonschema
from celpy.evaluation import CELEvalError, Evaluator

from moelora.local.apiserver.fielderrors import OMIT, FieldError, forbidden, invalid, not_supported, required

_META_FIELDS = ("metadata", "apiVersion", "kind")


def default_errors(schema: Mapping[str, Any], path: str) -> list[FieldError]:
    """Every error of the defaults in the root `schema` at field path `path` (`...openAPIV3Schema`)."""
    return list(_walk(schema, path, root=True))


def _walk(node: Mapping[str, Any], path: str, *, root: bool) -> Iterator[FieldError]:
    if node.get("default") is not None:
        yield from _one_default(node["default"], node, f"{path}.default")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}.items", root=False)
    for key, sub in (node.get("properties") or {}).items():
        if root and key in _META_FIELDS:
            continue  # defaults there are refused by the schema checks ("must not be set in top-level ...")
        yield from _walk(sub, f"{path}.properties[{key}]", root=False)


def _one_default(default: Any, node: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    if prune(default, node) != default:
        yield invalid(path, default, "must not have unknown fields")
    schema_errors = list(_schema_errors(default, node, path))
    if schema_errors:
        yield from schema_errors
    else:
        yield from rule_errors(default, node, path)


def prune(value: Any, node: Mapping[str, Any]) -> Any:
    """`value` without the fields `node` does not specify (pkg/apiserver/schema/pruning/algorithm.go)."""
    if isinstance(value, dict):
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        keep_unknown = node.get("x-kubernetes-preserve-unknown-fields") or extra is True
        result = {}
        for key, item in value.items():
            if properties is not None and key in properties:
                result[key] = prune(item, properties[key])
            elif node.get("x-kubernetes-embedded-resource") and key in _META_FIELDS:
                result[key] = item
            elif isinstance(extra, dict):
                result[key] = prune(item, extra)
            elif keep_unknown or (properties is None and extra is None and node.get("type") != "object"):
                result[key] = item
        return result
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [prune(item, node["items"]) for item in value]
    return value


def _schema_errors(value: Any, node: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    """The default against its node's OpenAPI schema, worded as kubeOpenAPIResultToFieldErrors words kube-openapi's
    results (pkg/apiserver/validation/validation.go): Required and NotSupported exactly, the rest as Invalid with
    jsonschema's own explanation."""
    for error in sorted(jsonschema.Draft7Validator(node).iter_errors(value), key=lambda e: list(e.absolute_path)):
        where = path + "".join(f".{part}" for part in error.absolute_path)
        if error.validator == "required":
            missing = re.match(r"'(.*)' is a required property", error.message)
            yield required(f"{where}.{missing.group(1)}" if missing else where)
        elif error.validator == "enum":
            yield not_supported(where, error.instance, list(error.validator_value))
        else:
            yield invalid(where, error.instance, error.message)


# -- CEL, as pkg/apiserver/schema/cel/validation.go evaluates it -------------------------------------------------------


def rule_errors(value: Any, node: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    """The x-kubernetes-validations of `node` and of the nodes below it, on `value` (Validator.validate)."""
    if value is None:
        return  # rules apply to non-null values only
    for rule in node.get("x-kubernetes-validations") or []:
        yield from _one_rule(rule, value, node, path)
    if isinstance(value, dict):
        extra = node.get("additionalProperties")
        for key, item in value.items():
            if isinstance(extra, dict):
                yield from rule_errors(item, extra, f"{path}[{key}]")
            elif key in (node.get("properties") or {}):
                yield from rule_errors(item, node["properties"][key], f"{path}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for index, item in enumerate(value):
            yield from rule_errors(item, node["items"], f"{path}[{index}]")


def _one_rule(rule: Mapping[str, Any], value: Any, node: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    program = _program(rule.get("rule", "").strip())
    if program is None:
        return
    kind = node.get("type", "")
    context = {"self": celpy.json_to_cel(value), "oldSelf": celpy.json_to_cel(value)}
    try:
        result = program.evaluate(context)
    except CELEvalError as exc:
        if (key := _missing_key(exc)) is not None:
            # "no such key: {key}" evaluating rule: <message or rule>
            yield invalid(path, kind, f"no such key: {key} evaluating rule: {_rule_text(rule)}")
        return
    if isinstance(result, celpy.celtypes.BoolType) and bool(result):
        return
    where = path
    if field_path := (rule.get("fieldPath") or "").strip().lstrip("."):
        where = f"{path}.{field_path}"
    detail = _message(rule, context)
    reason = rule.get("reason")
    if reason == "FieldValueForbidden":
        yield forbidden(where, detail)
    elif reason == "FieldValueRequired":
        yield required(where, detail)
    elif reason == "FieldValueDuplicate":
        yield FieldError("FieldValueDuplicate", where, "", OMIT if kind in ("object", "array") else value)
    else:
        yield invalid(where, OMIT if kind in ("object", "array") else value, detail)


def _rule_text(rule: Mapping[str, Any]) -> str:
    """ruleErrorString: the message if there is one, else the rule."""
    return (rule.get("message") or "").strip() or rule.get("rule", "").strip()


def _message(rule: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    """The messageExpression's result if it evaluates to a one-line string, else ruleMessageOrDefault."""
    if expression := (rule.get("messageExpression") or "").strip():
        program = _program(expression)
        if program is not None:
            try:
                text = str(program.evaluate(dict(context))).strip()
            except CELEvalError:
                text = ""
            if text and "\n" not in text:
                return text
    if message := (rule.get("message") or "").strip():
        return message
    return f"failed rule: {rule.get('rule', '').strip()}"


def _missing_key(exc: CELEvalError) -> str | None:
    """The key of cel-go's "no such key" when that is what cel-python's error is, else None."""
    found = re.match(r"no such member in mapping: '(.*)'$", str(exc.args[0]) if exc.args else "")
    if found:
        return found.group(1)
    if exc.args and exc.args[0] == "no such key" and len(exc.args) > 2 and exc.args[2]:
        return str(exc.args[2][0])
    return None


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
def _program(rule: str) -> Any:
    """The compiled rule, or None when it is empty or cel-python cannot compile it."""
    if not rule:
        return None
    env = celpy.Environment(runner_class=_Runner)
    try:
        return env.program(env.compile(rule))
    except celpy.CELParseError:
        return None
