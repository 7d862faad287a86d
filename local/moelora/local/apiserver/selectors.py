"""labelSelector and fieldSelector as the Kubernetes API server parses and applies them on lists and watches.

Label selectors: comma-separated requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`,
`k>N`, `k<N`; keys are qualified names (an optional DNS-subdomain prefix and `/`), values label values. `!=` and
`notin` also match objects without the key, as on a real server. Field selectors: `f=v`, `f==v`, `f!=v` with `\\`
escaping `,`, `=` and `\\`; only the fields a resource declares are selectable (metadata.name/namespace on every
kind, a few per built-in kind, `spec.selectableFields` of a CRD); any other field is refused, as a real server does.
A malformed selector raises `SelectorError` (the server answers 400 BadRequest). On a watch, an object that stops
matching is sent as DELETED, one that starts matching as ADDED (`selected_event`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from moelora.api.crd import custom_resource_definitions

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_NAME_RE = re.compile(rf"^{_NAME}$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TOKEN_RE = re.compile(r"\s*(==|!=|=|!|\(|\)|,|>|<|[^\s=!(),<>]+)")
_SET_OPERATORS = ("in", "notin")

# Fields a real server selects on besides metadata.name and metadata.namespace, per built-in kind.
BUILTIN_FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                       "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"}),
    "events": frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                         "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                         "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}),
    "secrets": frozenset({"type"}),
}  # fmt: skip
_OBJECT_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


class SelectorError(ValueError):
    """A selector the API server would refuse."""


@dataclasses.dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # =, !=, in, notin, exists, !exists, gt, lt
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator in ("=", "in"):
            return present and value in self.values
        if self.operator in ("!=", "notin"):
            return not present or value not in self.values
        if self.operator == "exists":
            return present
        if self.operator == "!exists":
            return not present
        try:  # gt, lt: both sides integers, else no match
            have, bound = int(value or ""), int(next(iter(self.values)))
        except ValueError:
            return False
        return have > bound if self.operator == "gt" else have < bound


def _check_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _PREFIX_RE.match(prefix)):
        raise SelectorError(f"invalid label key {key!r}: the prefix must be a DNS subdomain")
    if not name or len(name) > 63 or not _NAME_RE.match(name):
        raise SelectorError(f"invalid label key {key!r}: the name must be 63 characters of [-A-Za-z0-9_.]")
    return key


def _check_value(value: str) -> str:
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise SelectorError(f"invalid label value {value!r}: at most 63 characters of [-A-Za-z0-9_.]")
    return value


def _tokens(text: str) -> list[str]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        if match is None:
            raise SelectorError(f"unexpected character at {position} in {text!r}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def parse_labels(text: str) -> list[Requirement]:
    """The requirements of a labelSelector (all must hold); [] for an empty one, which selects everything."""
    tokens = _tokens(text)
    requirements: list[Requirement] = []
    index = 0

    def take() -> str:
        nonlocal index
        if index >= len(tokens):
            raise SelectorError(f"unexpected end of selector {text!r}")
        index += 1
        return tokens[index - 1]

    def peek() -> str | None:
        return tokens[index] if index < len(tokens) else None

    while index < len(tokens):
        token = take()
        if token == "!":
            requirements.append(Requirement(_check_key(take()), "!exists", frozenset()))
        else:
            key = _check_key(token)
            following = peek()
            if following is None or following == ",":
                requirements.append(Requirement(key, "exists", frozenset()))
            elif following in ("=", "==", "!="):
                take()
                value = "" if peek() in (None, ",") else take()
                operator = "!=" if following == "!=" else "="
                requirements.append(Requirement(key, operator, frozenset({_check_value(value)})))
            elif following in (">", "<"):
                take()
                bound = take()
                if not re.fullmatch(r"-?[0-9]+", bound):
                    raise SelectorError(f"{key}{following}{bound}: the value must be an integer")
                requirements.append(Requirement(key, "gt" if following == ">" else "lt", frozenset({bound})))
            elif following in _SET_OPERATORS:
                take()
                if take() != "(":
                    raise SelectorError(f"{key} {following}: expected '(' in {text!r}")
                values: set[str] = set()
                while True:
                    item = take()
                    if item == ")":
                        break
                    if item == ",":
                        values.add("")  # an empty value between commas, as Kubernetes reads it
                        continue
                    values.add(_check_value(item))
                    if peek() == ",":
                        take()
                if not values:
                    raise SelectorError(f"{key} {following} (): the set of values must not be empty")
                requirements.append(Requirement(key, following, frozenset(values)))
            else:
                raise SelectorError(f"unexpected {following!r} after {key!r} in {text!r}")
        if peek() is not None and take() != ",":
            raise SelectorError(f"expected ',' between requirements in {text!r}")
        if index == len(tokens) and tokens[-1] == ",":
            raise SelectorError(f"trailing ',' in {text!r}")
    return requirements


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts, current, escaped = [], "", False
    for char in text:
        if escaped:
            current += "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append(current)
            current = ""
        else:
            current += char
    if escaped:
        raise SelectorError(f"a trailing backslash in {text!r}")
    return [*parts, current]


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_fields(text: str) -> list[tuple[str, str, str]]:
    """A fieldSelector's (field, '=' or '!=', value) terms; [] for an empty one."""
    terms = []
    for term in _split_unescaped(text, ","):
        if not term.strip():
            if text.strip():
                raise SelectorError(f"an empty term in {text!r}")
            continue
        match = re.match(r"^([^=!\\]+?)\s*(==|!=|=)(.*)$", term)
        if match is None:
            raise SelectorError(f"invalid field selector term {term!r}: expected field=value or field!=value")
        value = match.group(3)
        if re.search(r"(?<!\\)=", value):
            raise SelectorError(f"invalid field selector term {term!r}: an unescaped '=' in the value")
        terms.append((match.group(1).strip(), "!=" if match.group(2) == "!=" else "=", _unescape(value)))
    return terms


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclasses.dataclass(frozen=True)
class Selector:
    labels: list[Requirement]
    fields: list[tuple[str, str, str]]

    @classmethod
    def from_params(cls, params: Mapping[str, str], *, selectable: Collection[str] = ()) -> Selector:
        """The selectors of a list or watch request; `selectable`: the fields this resource allows beyond metadata."""
        fields = parse_fields(params.get("fieldSelector") or "")
        for field, _, _ in fields:
            if field not in _OBJECT_FIELDS and field not in selectable:
                raise SelectorError(f"field label not supported: {field}")
        return cls(parse_labels(params.get("labelSelector") or ""), fields)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if not all(requirement.matches(labels) for requirement in self.labels):
            return False
        return all((_field_value(obj, field) == value) == (op == "=") for field, op, value in self.fields)


def request_filter(request: Any, *, selectable: Collection[str]) -> Callable[[Any, Mapping[str, Any]], bool]:
    """Whether a (resource, object) is in what a list or watch request asks for: its resource, namespace, name and
    selectors."""
    selector = Selector.from_params(request.params, selectable=selectable)

    def matches(resource: Any, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return (
            resource == request.resource
            and (request.namespace is None or meta.get("namespace") == request.namespace)
            and (request.name is None or meta.get("name") == request.name)
            and selector.matches(obj)
        )

    return matches


def selection_key(resource: Any, obj: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    meta = obj.get("metadata") or {}
    return (resource, meta.get("namespace"), meta.get("name"))


def selected_event(
    resource: Any, event: dict[str, Any], *, selected: bool, passing: set[tuple[Any, Any, Any]]
) -> dict[str, Any] | None:
    """A watch event as a selecting watch sends it: an object that stops matching the selector is DELETED from the
    watch's view, one that starts matching is ADDED, others' events are not sent. `passing`: the selection_key of
    the objects the watch has seen matching so far, kept up to date here."""
    key = selection_key(resource, event["object"])
    was = key in passing
    if event.get("type") == "DELETED":
        passing.discard(key)
        return event if was or selected else None
    if selected:
        passing.add(key)
        return event if was or event.get("type") == "ADDED" else {**event, "type": "ADDED"}
    passing.discard(key)
    return {**event, "type": "DELETED"} if was else None


def selectable_fields(key: Callable[[str], Any] = str) -> dict[Any, frozenset[str]]:
    """Our CRDs' `selectableFields`, by `key('group/version/plural')`."""
    result = {}
    for crd in custom_resource_definitions():
        spec = crd["spec"]
        for version in spec["versions"]:
            fields = version.get("selectableFields") or spec.get("selectableFields") or []
            resource = key(f"{spec['group']}/{version['name']}/{spec['names']['plural']}")
            result[resource] = frozenset(field["jsonPath"].lstrip(".") for field in fields)
    return result
