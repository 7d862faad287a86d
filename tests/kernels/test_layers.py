"""The kernels' layering, read from the source: the runtime (moelora.kernels outside tools/) imports neither its
tools nor the vLLM plugin above it; the tools import the runtime but not the plugin (a caller hands them its op);
the plugin imports the runtime, never the tools (they are not in the wheel)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kernels" / "moelora" / "kernels"
PLUGIN = ROOT / "image" / "moelora" / "vllm_plugin"


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module the file imports, anywhere in it (relative imports resolved)."""
    source_root = ROOT / path.relative_to(ROOT).parts[0]  # kernels/ or image/
    package = ".".join(path.relative_to(source_root).parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


RUNTIME = sorted(p for p in PACKAGE.glob("*.py"))
TOOLS = sorted((PACKAGE / "tools").glob("*.py"))
PLUGIN_MODULES = sorted(PLUGIN.glob("*.py"))


@pytest.mark.parametrize("path", RUNTIME, ids=lambda p: p.name)
def test_the_runtime_imports_neither_the_tools_nor_the_plugin(path):
    bad = {m for m in imported_modules(path) if m.startswith(("moelora.kernels.tools", "moelora.vllm_plugin"))}
    assert not bad, bad


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.name)
def test_the_tools_do_not_import_the_plugin(path):
    assert not {m for m in imported_modules(path) if m.startswith("moelora.vllm_plugin")}


@pytest.mark.parametrize("path", PLUGIN_MODULES, ids=lambda p: p.name)
def test_the_plugin_does_not_import_the_tools(path):
    assert not {m for m in imported_modules(path) if m.startswith("moelora.kernels.tools")}


def test_the_resolver_sees_relative_imports():
    assert "moelora.kernels.tools.vllm_configs" in imported_modules(PACKAGE / "tools" / "tune.py")
    assert "moelora.kernels.routing" in imported_modules(PACKAGE / "fused.py")
    assert "moelora.vllm_plugin.patches" in imported_modules(PLUGIN / "install.py")
