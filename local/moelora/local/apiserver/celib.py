"""The Kubernetes CEL libraries cel-python lacks, as celpy functions, so CRD rules evaluate as kube-apiserver's do.

kube-apiserver's CEL environment (k8s.io/apiserver/pkg/cel/environment/base.go) adds to standard CEL cel-go's
string extensions (cel-go ext/strings.go: charAt, indexOf, lastIndexOf, lowerAscii, upperAscii, replace, split,
substring, trim, join) and its own libraries (k8s.io/apiserver/pkg/cel/library: lists.go isSorted, sum, min, max,
indexOf, lastIndexOf; regex.go find, findAll; urls.go url, isURL and the URL getters). Those are implemented here
with the semantics their documentation gives (indexes count code points; out-of-range arguments are errors).
Not implemented (no rule we validate uses them): quantity, ip/cidr, semver, format, sets, the authz library.

cel-python calls a method `x.f(a)` as the function `f(x, a)`, so one function serves both forms and overloads are
told apart by the receiver's type (`indexOf` of a string and of a list). A CELEvalError return is CEL's error value.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Any

import celpy
import re2
from celpy import celtypes

CELEvalError = celpy.CELEvalError


def _error(message: str) -> CELEvalError:
    return CELEvalError(message, ValueError, None)


def _index(size: int, index: Any) -> int | CELEvalError:
    """A code point index in [0, size], or the error cel-go gives for one outside it."""
    if not 0 <= int(index) <= size:
        return _error(f"index out of range: {int(index)}")
    return int(index)


# --- cel-go ext/strings.go ---------------------------------------------------------------------------------------


def char_at(text: str, index: Any) -> Any:
    position = _index(len(text), index)
    return position if isinstance(position, CELEvalError) else celtypes.StringType(text[position : position + 1])


def index_of(target: Any, value: Any, offset: Any = 0) -> Any:
    if isinstance(target, list):  # lists.go: the first index of an equal element, -1 if none
        return celtypes.IntType(next((i for i, item in enumerate(target) if item == value), -1))
    start = _index(len(target), offset)
    if isinstance(start, CELEvalError):
        return start
    return celtypes.IntType(str(target).find(str(value), start))


def last_index_of(target: Any, value: Any, offset: Any = None) -> Any:
    if isinstance(target, list):
        return celtypes.IntType(max((i for i, item in enumerate(target) if item == value), default=-1))
    text = str(target)
    if offset is None:
        return celtypes.IntType(text.rfind(str(value)))
    end = _index(len(text) - 1, offset)  # an offset at the end is out of range here, unlike indexOf's
    if isinstance(end, CELEvalError):
        return end
    return celtypes.IntType(text.rfind(str(value), 0, end + len(str(value))))


def lower_ascii(text: str) -> celtypes.StringType:
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in text))


def upper_ascii(text: str) -> celtypes.StringType:
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in text))


def replace(text: str, old: str, new: str, limit: Any = -1) -> celtypes.StringType:
    """All occurrences, or the first `limit` when it is not negative (Go's strings.Replace)."""
    return celtypes.StringType(str(text).replace(str(old), str(new), int(limit) if int(limit) >= 0 else -1))


def split(text: str, separator: str, limit: Any = -1) -> celtypes.ListType:
    """Go's strings.SplitN: limit 0 gives [], a negative limit every part, an empty separator each code point."""
    count = int(limit)
    if count == 0:
        return celtypes.ListType([])
    if separator == "":
        parts = list(text)
        if 0 < count < len(parts):
            parts = [*parts[: count - 1], "".join(parts[count - 1 :])]
    else:
        parts = str(text).split(str(separator), count - 1 if count > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def substring(text: str, start: Any, end: Any = None) -> Any:
    first = _index(len(text), start)
    if isinstance(first, CELEvalError):
        return first
    last = len(text) if end is None else _index(len(text), end)
    if isinstance(last, CELEvalError):
        return last
    if last < first:
        return _error(f"invalid substring range. start: {first}, end: {last}")
    return celtypes.StringType(text[first:last])


def trim(text: str) -> celtypes.StringType:
    return celtypes.StringType(str(text).strip())  # Unicode white space, as Go's unicode.IsSpace


def join(items: list[Any], separator: str = "") -> Any:
    if not all(isinstance(item, str) for item in items):
        return _error("join: a list of strings is required")
    return celtypes.StringType(str(separator).join(items))


# --- k8s.io/apiserver/pkg/cel/library/lists.go --------------------------------------------------------------------


def is_sorted(items: list[Any]) -> celtypes.BoolType:
    return celtypes.BoolType(all(a <= b for a, b in zip(items, items[1:])))


def list_sum(items: list[Any]) -> Any:
    """The sum; an empty list sums to int 0 (the library types the zero by the list's element type)."""
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def list_min(items: list[Any]) -> Any:
    return min(items) if items else _error("min called on empty list")


def list_max(items: list[Any]) -> Any:
    return max(items) if items else _error("max called on empty list")


# --- k8s.io/apiserver/pkg/cel/library/regex.go -------------------------------------------------------------------


def find(text: str, pattern: str) -> Any:
    """The first match of the RE2 pattern, or "" when none."""
    try:
        match = re2.search(str(pattern), str(text))
    except re2.error as exc:
        return _error(f"invalid regex: {exc}")
    return celtypes.StringType(match.group(0) if match else "")


def find_all(text: str, pattern: str, limit: Any = -1) -> Any:
    """Every match (at most `limit` when it is not negative)."""
    try:
        compiled = re2.compile(str(pattern))
    except re2.error as exc:
        return _error(f"invalid regex: {exc}")
    found = [celtypes.StringType(m.group(0)) for m in compiled.finditer(str(text))]
    return celtypes.ListType(found if int(limit) < 0 else found[: int(limit)])


# --- k8s.io/apiserver/pkg/cel/library/urls.go --------------------------------------------------------------------

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


class URL(celtypes.StringType):
    """A parsed URL: its text, with the parts Go's net/url would split it into."""

    @property
    def parts(self) -> urllib.parse.SplitResult:
        return urllib.parse.urlsplit(str(self))


def _request_uri_error(text: str) -> str | None:
    """Why Go's url.ParseRequestURI (what url() and isURL() check) refuses `text`: it takes an absolute URL or an
    absolute path, without control characters; None when it accepts it."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return "net/url: invalid control character in URL"
    if text.startswith("/"):
        return None
    scheme, colon, rest = text.partition(":")
    if not colon or not _SCHEME.fullmatch(scheme):
        return "invalid URI for request"
    if rest.startswith("//"):
        host = re.split(r"[/?#]", rest[2:], maxsplit=1)[0].rpartition("@")[2]
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if " " in host:
            return 'invalid character " " in host name'
        if ":" in port and not port.partition(":")[2].isdigit() and port.partition(":")[2]:
            return f'invalid port "{port[port.index(":") :]}" after host'
    return None


def url(text: str) -> Any:
    problem = _request_uri_error(str(text))
    if problem is not None:
        return _error(f"URL parse error during conversion from string: {problem}")
    return URL(text)


def is_url(text: str) -> celtypes.BoolType:
    return celtypes.BoolType(_request_uri_error(str(text)) is None)


def get_scheme(value: URL) -> celtypes.StringType:
    return celtypes.StringType(value.parts.scheme)


def get_host(value: URL) -> celtypes.StringType:
    """The host with its port, an IPv6 address in brackets."""
    return celtypes.StringType(value.parts.netloc.rpartition("@")[2])


def get_hostname(value: URL) -> celtypes.StringType:
    """The host without port or brackets."""
    host = value.parts.netloc.rpartition("@")[2]
    if host.startswith("["):
        return celtypes.StringType(host[1:].partition("]")[0])
    return celtypes.StringType(host.partition(":")[0])


def get_port(value: URL) -> celtypes.StringType:
    host = value.parts.netloc.rpartition("@")[2]
    after = host.rpartition("]")[2] if host.startswith("[") else host
    return celtypes.StringType(after.partition(":")[2])


def get_escaped_path(value: URL) -> celtypes.StringType:
    return celtypes.StringType(urllib.parse.quote(urllib.parse.unquote(value.parts.path), safe="/!$&'()*+,;=:@-._~"))


def get_query(value: URL) -> celtypes.MapType:
    """Each query parameter -> its values, in order."""
    parsed = urllib.parse.parse_qs(value.parts.query, keep_blank_values=True)
    return celtypes.MapType(
        {
            celtypes.StringType(key): celtypes.ListType([celtypes.StringType(v) for v in values])
            for key, values in parsed.items()
        }
    )


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "charAt": char_at,
    "indexOf": index_of,
    "lastIndexOf": last_index_of,
    "lowerAscii": lower_ascii,
    "upperAscii": upper_ascii,
    "replace": replace,
    "split": split,
    "substring": substring,
    "trim": trim,
    "join": join,
    "isSorted": is_sorted,
    "sum": list_sum,
    "min": list_min,
    "max": list_max,
    "find": find,
    "findAll": find_all,
    "url": url,
    "isURL": is_url,
    "getScheme": get_scheme,
    "getHost": get_host,
    "getHostname": get_hostname,
    "getPort": get_port,
    "getEscapedPath": get_escaped_path,
    "getQuery": get_query,
}
