"""Check moelora's touchpoints (touchpoints.py) against a vLLM source tree, by reading it: nothing is imported, so
a release that cannot run here (another torch, CUDA-only) can be checked from its unpacked wheel.

    python -m moelora.vllm_plugin.source_check ROOT [ROOT ...]

ROOT is a `vllm` package folder (the installed one, or `vllm/` of an unpacked wheel). Prints one Markdown table with
a column per ROOT (its version read from `_version.py`) and exits 1 when any touchpoint fails in any ROOT.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re
import sys
from dataclasses import dataclass

from .touchpoints import TOUCHPOINTS, Touchpoint

__all__ = ["Finding", "check", "check_one", "main", "version_of"]


@dataclass(frozen=True)
class Finding:
    """One touchpoint in one tree: `ok`, the file that satisfied it (or None), and what was found otherwise."""

    touchpoint: Touchpoint
    ok: bool
    file: str | None
    detail: str


def check(root: pathlib.Path, touchpoints: tuple[Touchpoint, ...] = TOUCHPOINTS) -> list[Finding]:
    return [check_one(root, touchpoint) for touchpoint in touchpoints]


def check_one(root: pathlib.Path, touchpoint: Touchpoint) -> Finding:
    """The first listed file that satisfies the touchpoint; else why each existing file did not."""
    reasons = []
    for relative in touchpoint.files:
        path = root / relative
        if not path.is_file():
            continue
        source, tree = _parsed(path)
        reason = _CHECKS[touchpoint.kind](source, tree, touchpoint)
        if reason is None:
            return Finding(touchpoint, True, relative, "")
        reasons.append(f"{relative}: {reason}")
    if not reasons:
        return Finding(touchpoint, False, None, f"none of {', '.join(touchpoint.files)} exists")
    return Finding(touchpoint, False, None, "; ".join(reasons))


def version_of(root: pathlib.Path) -> str:
    """`__version__` from the tree's `_version.py` (setuptools-scm writes it into wheels), or '?'."""
    path = root / "_version.py"
    if path.is_file():
        match = re.search(r"""__version__ = version = ['"]([^'"]+)['"]""", path.read_text())
        if match:
            return match.group(1)
    return "?"


def _parsed(path: pathlib.Path) -> tuple[str, ast.Module]:
    """The file's text and syntax tree, parsed once per version of the file (many touchpoints share a file)."""
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _parse(path: pathlib.Path, mtime_ns: int, size: int) -> tuple[str, ast.Module]:
    source = path.read_text(encoding="utf-8")
    return source, ast.parse(source, filename=str(path))


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    """A top-level function or class, or a method of one, by dotted name."""
    node: ast.AST = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        found = [n for n in body if isinstance(n, _DEFS) and n.name == part]
        if not found:
            return None
        node = found[-1]  # a later definition wins, as at import time
    return node


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    args = node.args
    return tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def _check_params(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    node = _find(tree, tp.target)
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"no function {tp.target}"
    got = _parameters(node)
    if isinstance(tp.expect, frozenset):
        missing = sorted(tp.expect - set(got))
        return f"{tp.target} lacks {missing}" if missing else None
    if got != tuple(tp.expect):
        return f"{tp.target} has {_difference(got, tuple(tp.expect))}"
    return None


def _difference(got: tuple[str, ...], want: tuple[str, ...]) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"parameter {i} {g!r}, expected {w!r}"
    return f"{len(got)} parameters, expected {len(want)}"


def _class_names(node: ast.ClassDef) -> set[str]:
    """Names a class body defines: methods, properties, assignments and annotations."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return names


def _class_fields(node: ast.ClassDef) -> set[str]:
    return {i.target.id for i in node.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)}


def _check_members(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    node = _find(tree, tp.target)
    if not isinstance(node, ast.ClassDef):
        return f"no class {tp.target}"
    missing = sorted(set(tp.expect) - _class_names(node))
    return f"{tp.target} lacks {missing}" if missing else None


def _check_fields(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    node = _find(tree, tp.target)
    if not isinstance(node, ast.ClassDef):
        return f"no class {tp.target}"
    missing = sorted(set(tp.expect) - _class_fields(node))
    return f"{tp.target} lacks fields {missing}" if missing else None


def _check_returns(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    node = _find(tree, tp.target)
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"no function {tp.target}"
    returned = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)]
    if not returned:
        return f"{tp.target} returns no tuple"
    got = tuple(ast.unparse(element) for element in returned[-1].elts)
    if got != tuple(tp.expect):
        return f"{tp.target} returns ({', '.join(got)})"
    return None


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _literal(node: ast.expr) -> object:
    """A constant's value; any other expression as its source text."""
    return node.value if isinstance(node, ast.Constant) else ast.unparse(node)


def _check_op(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    func_name, *mutated = tp.expect
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if not (isinstance(call.func, ast.Name) and call.func.id == "direct_register_custom_op"):
            continue
        kwargs = _keywords(call)
        name = kwargs.get("op_name")
        if not (isinstance(name, ast.Constant) and name.value == tp.target):
            continue
        func = kwargs.get("op_func")
        got_func = func.id if isinstance(func, ast.Name) else ast.unparse(func) if func else None
        args = kwargs.get("mutates_args")
        got_mutated = [_literal(e) for e in args.elts] if isinstance(args, ast.List | ast.Tuple) else None
        if got_func != func_name or got_mutated != mutated:
            return f"op {tp.target} registers {got_func} mutating {got_mutated}"
        return None
    return f"no registration of op {tp.target}"


def _check_imports(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    (module,) = tp.expect
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            if any(alias.name == tp.target and alias.asname in (None, tp.target) for alias in node.names):
                return None
    return f"no `from {module} import {tp.target}`"


_ROUTE_METHODS = {"get", "post", "put", "delete", "patch", "websocket", "api_route"}


def _check_route(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    (method,) = tp.expect
    seen = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
                continue
            verb = decorator.func.attr
            path = decorator.args[0] if decorator.args else None
            if verb in _ROUTE_METHODS and isinstance(path, ast.Constant) and path.value == tp.target:
                if verb == method:
                    return None
                seen.append(verb)
    return f"{tp.target} is served by {seen}" if seen else f"no route {tp.target}"


def _check_env(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == tp.target for k in node.keys):
            return None
    return f"{tp.target} is not in the environment table"


def _check_flag(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    field = tp.target.removeprefix("--").replace("-", "_")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and field in _class_fields(node):
            return None
    return f"no class field {field}"


def _check_text(source: str, tree: ast.Module, tp: Touchpoint) -> str | None:
    missing = [text for text in tp.expect if text not in source]
    return f"missing {missing}" if missing else None


_CHECKS = {
    "params": _check_params,
    "members": _check_members,
    "fields": _check_fields,
    "returns": _check_returns,
    "op": _check_op,
    "imports": _check_imports,
    "route": _check_route,
    "env": _check_env,
    "flag": _check_flag,
    "text": _check_text,
}


def table(roots: list[pathlib.Path]) -> tuple[str, bool]:
    """A Markdown table (touchpoint, kind, used by, one column per root) and whether everything held. A cell names
    the file only when it is not the first listed one (a module vLLM moved)."""
    results = [check(root) for root in roots]
    header = ["touchpoint", "kind", "used by", *(f"vLLM {version_of(root)}" for root in roots)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row, touchpoint in enumerate(TOUCHPOINTS):
        cells = []
        for findings in results:
            finding = findings[row]
            if not finding.ok:
                cells.append(f"**FAILS**: {finding.detail}")
            else:  # where vLLM moved it, the file that now holds it
                cells.append("ok" if finding.file == touchpoint.files[0] else f"ok ({finding.file})")
        lines.append("| " + " | ".join([touchpoint.name, touchpoint.kind, touchpoint.used_by, *cells]) + " |")
    return "\n".join(lines), all(f.ok for findings in results for f in findings)


def main(argv: list[str] | None = None) -> int:
    roots = [pathlib.Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    if not roots or not all((root / "envs.py").is_file() for root in roots):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    text, ok = table(roots)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
