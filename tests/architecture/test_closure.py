"""What each image runs, checked two ways.

Statically (grimp, the graph import-linter uses): every third-party package the image's moelora packages import is
installed by that image's extra. Dynamically, in a fresh interpreter that imports every module of those packages:
the operator never loads torch, and no image loads the local stack or the kernel tools.
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import re
import subprocess
import sys

import grimp
import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNTIME = ("moelora.api", "moelora.operator", "moelora.agent", "moelora.vllm_plugin", "moelora.kernels")
# What each image installs and which of our packages it runs (Dockerfile: moelora[operator], moelora[agent] on
# top of vLLM's image, which brings torch, triton, vLLM itself and the FastAPI its server is built on).
IMAGES = {
    "operator": (("moelora.api", "moelora.operator"), "operator", set()),
    "agent": (("moelora.api", "moelora.agent"), "agent", set()),
    "plugin": (("moelora.vllm_plugin", "moelora.kernels"), "", {"torch", "triton", "vllm", "fastapi"}),
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_by(extra: str) -> set[str]:
    """Distributions moelora[extra] installs, following requirements transitively."""
    wanted, seen = [("moelora", frozenset({extra} if extra else set()))], set()
    while wanted:
        name, extras = wanted.pop()
        if (norm(name), extras) in seen:
            continue
        seen.add((norm(name), extras))
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            environments = [{"extra": e} for e in extras] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                wanted.append((requirement.name, frozenset(requirement.extras)))
    return {name for name, _ in seen}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*RUNTIME, include_external_packages=True)


def imported_packages(graph: grimp.ImportGraph, packages: tuple[str, ...]) -> set[str]:
    """Top-level third-party packages imported by any module of `packages` (function-level imports included)."""
    found = set()
    for module in graph.modules:
        if module.startswith(tuple(p + "." for p in packages)) or module in packages:
            found |= {m.split(".")[0] for m in graph.find_modules_directly_imported_by(module)}
    return {m for m in found if m != "moelora" and m not in sys.stdlib_module_names}


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_import_is_installed_by_the_image(graph: grimp.ImportGraph, image: str) -> None:
    packages, extra, base = IMAGES[image]
    providers = importlib.metadata.packages_distributions()
    allowed = installed_by(extra) | base
    missing = {
        top: providers.get(top, [])
        for top in imported_packages(graph, packages)
        if top not in base and not {norm(d) for d in providers.get(top, [])} & allowed
    }
    assert missing == {}, f"{image}: imports what its extra does not install"


def test_the_static_check_can_fail(graph: grimp.ImportGraph) -> None:
    """The operator's extra does not install boto3, which the agent imports: the same check flags it."""
    providers = importlib.metadata.packages_distributions()
    agent_imports = imported_packages(graph, ("moelora.agent",))
    assert "boto3" in agent_imports
    assert not {norm(d) for d in providers["boto3"]} & installed_by("operator")


PROBE = r"""
import importlib, json, pkgutil, sys

def walk(name):
    # pkgutil.walk_packages would import a package to look inside it; the tools must not even be imported.
    module = importlib.import_module(name)
    for info in pkgutil.iter_modules(getattr(module, "__path__", []), name + "."):
        if info.name != "moelora.kernels.tools":
            walk(info.name)

for name in sys.argv[1:]:
    walk(name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded(*packages: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", PROBE, *packages], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_operator_loads_no_torch_and_no_other_part() -> None:
    modules = loaded("moelora.api", "moelora.operator")
    assert not {m for m in modules if m.split(".")[0] in {"torch", "triton", "vllm", "boto3", "transformers"}}
    assert not {m for m in modules if m.startswith(("moelora.agent", "moelora.kernels", "moelora.local"))}


def test_agent_loads_no_operator_and_no_torch() -> None:
    modules = loaded("moelora.api", "moelora.agent")
    assert not {m for m in modules if m.split(".")[0] in {"kopf", "torch", "triton", "vllm"}}
    assert not {m for m in modules if m.startswith(("moelora.operator", "moelora.local", "moelora.kernels"))}


def test_plugin_loads_neither_tools_nor_local_stack() -> None:
    pytest.importorskip("vllm")
    modules = loaded("moelora.vllm_plugin", "moelora.kernels")
    assert not {m for m in modules if m.startswith(("moelora.kernels.tools", "moelora.local", "moelora.operator"))}
    assert not {m for m in modules if m.split(".")[0] == "kopf"}
