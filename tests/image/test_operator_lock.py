"""image/operator.lock, the operator image's hash-pinned dependencies, checked against pyproject.toml offline.

The lock is made by `uv pip compile` (the command is its header); these tests need no resolver and no network. They
read the lock's pins, hashes and "via" comments: every requirement of moelora[operator] is pinned there at a version
it allows, every other pin is needed by one of them, and the Dockerfile installs from it in hash-checking mode.
A requirement of a pinned package that the lock misses is caught when the image is built (pip check).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import DOCKERFILE, ROOT, stages

LOCK = ROOT / "image" / "operator.lock"
PROJECT = "moelora (pyproject.toml)"
# The Python of the Dockerfile's PYTHON_IMAGE, for evaluating environment markers.
IMAGE_ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.11", "sys_platform": "linux"}


@dataclasses.dataclass
class Pin:
    version: str
    hashes: list[str]
    via: set[str]


def parse_lock(text: str) -> dict[str, Pin]:
    """Pins by canonical name, from `name==version \\` lines, their `--hash=` lines and `# via` comments."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    for line in text.splitlines():
        if match := re.match(r"([A-Za-z0-9_.-]+)==(\S+?)(\s*;.*?)?\s*\\?$", line):
            current = pins.setdefault(canonicalize_name(match.group(1)), Pin(match.group(2), [], set()))
            in_via = False
        elif current is None:
            continue
        elif match := re.fullmatch(r"\s+--hash=(sha256:[0-9a-f]{64})\s*\\?", line):
            current.hashes.append(match.group(1))
        elif match := re.fullmatch(r"\s+# via(?: (.+))?", line):
            in_via = True
            if match.group(1):
                current.via.add(match.group(1).strip())
        elif in_via and (match := re.fullmatch(r"\s+#\s+(.+)", line)):
            current.via.add(match.group(1).strip())
    return pins


def operator_requirements(pyproject: pathlib.Path) -> list[Requirement]:
    """What installing moelora[operator] asks for directly: the core dependencies and the operator extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["operator"]]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(IMAGE_ENVIRONMENT)]


def lock_problems(pyproject: pathlib.Path, lock: pathlib.Path) -> list[str]:
    """Why the lock does not match pyproject.toml: empty when it is current."""
    pins = parse_lock(lock.read_text())
    problems = [f"{name}: no --hash" for name, pin in pins.items() if not pin.hashes]
    direct = set()
    for requirement in operator_requirements(pyproject):
        name = canonicalize_name(requirement.name)
        direct.add(name)
        if name not in pins:
            problems.append(f"{requirement}: not pinned in {lock.name}")
        elif not requirement.specifier.contains(pins[name].version, prereleases=True):
            problems.append(f"{requirement}: {lock.name} pins {pins[name].version}")
        elif PROJECT not in pins[name].via:
            problems.append(f"{name}: pinned, but not via {PROJECT}")
    for name, pin in pins.items():
        if PROJECT in pin.via and name not in direct:
            problems.append(f"{name}: via {PROJECT}, which no longer asks for it")
        unknown = {canonicalize_name(parent) for parent in pin.via - {PROJECT}} - pins.keys()
        if unknown:
            problems.append(f"{name}: via {sorted(unknown)}, which the lock does not pin")
    # Everything pinned must hang off moelora through the via chain: nothing left over from an old resolution.
    reachable = {name for name, pin in pins.items() if PROJECT in pin.via}
    while grown := {
        name
        for name, pin in pins.items()
        if name not in reachable and {canonicalize_name(p) for p in pin.via} & reachable
    }:
        reachable |= grown
    problems += [f"{name}: pinned, but nothing installed needs it" for name in sorted(pins.keys() - reachable)]
    return problems


def test_the_lock_is_current() -> None:
    problems = lock_problems(ROOT / "pyproject.toml", LOCK)
    assert problems == [], "regenerate image/operator.lock with the command in its header (image/README.md)"


def test_the_lock_pins_the_operator_closure() -> None:
    pins = parse_lock(LOCK.read_text())
    assert {"kopf", "kubernetes", "pydantic", "pyyaml", "aiohttp", "pydantic-core", "prometheus-client"} <= pins.keys()
    # The operator image has no torch, no vLLM and none of the agent's own dependencies (it shares prometheus-client).
    assert not pins.keys() & {"torch", "triton", "vllm", "boto3", "transformers"}
    # One lock for amd64 and arm64: it names every file of each pinned version, so each compiled package has several.
    assert len(pins["pydantic-core"].hashes) > 2


def test_the_lock_says_how_it_was_made() -> None:
    header = LOCK.read_text().splitlines()[:2]
    command = header[1]
    assert "uv pip compile pyproject.toml --extra operator --generate-hashes --python-version 3.11" in command
    assert "--output-file image/operator.lock" in command
    # The same command is the one image/README.md documents.
    assert command.removeprefix("#").strip() in (ROOT / "image" / "README.md").read_text()


def write_pyproject(path: pathlib.Path, edit: tuple[str, str]) -> pathlib.Path:
    text = (ROOT / "pyproject.toml").read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    return path


def test_a_stale_lock_is_caught(tmp_path: pathlib.Path) -> None:
    """The check above can fail: a requirement added, tightened past the pin, or dropped in a copy of pyproject.toml."""
    lock = pathlib.Path(shutil.copy(LOCK, tmp_path / "operator.lock"))
    operator = '"kopf>=1.45,<2", "kubernetes>=37", "prometheus-client>=0.20"]'
    added = write_pyproject(tmp_path / "added.toml", (operator, operator.replace("]", ', "rich>=13"]')))
    assert lock_problems(added, lock) == ["rich>=13: not pinned in operator.lock"]
    kopf = parse_lock(LOCK.read_text())["kopf"].version
    tightened = write_pyproject(tmp_path / "tightened.toml", ('"kopf>=1.45,<2"', f'"kopf>{kopf},<2"'))
    assert lock_problems(tightened, lock) == [f"kopf<2,>{kopf}: operator.lock pins {kopf}"]
    dropped = write_pyproject(tmp_path / "dropped.toml", ('"kopf>=1.45,<2", ', ""))
    problems = lock_problems(dropped, lock)
    assert f"kopf: via {PROJECT}, which no longer asks for it" in problems
    # A pin left behind by an old resolution, and one whose hashes were stripped.
    (tmp_path / "extra.lock").write_text(LOCK.read_text() + "rich==13.9.4 \\\n    # via pygments\n")
    assert lock_problems(ROOT / "pyproject.toml", tmp_path / "extra.lock") == [
        "rich: no --hash",
        "rich: via ['pygments'], which the lock does not pin",
        "rich: pinned, but nothing installed needs it",
    ]


def test_the_operator_image_installs_only_from_the_lock() -> None:
    runs = [arguments for instruction, arguments in stages()["operator"] if instruction == "RUN"]
    installs = [
        command.strip() for run in runs for command in run.split("&&") if re.search(r"\bpip3? install\b", command)
    ]
    lock_install = next(c for c in installs if "/tmp/operator.lock" in c)
    for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:", "-r /tmp/operator.lock"):
        assert flag in lock_install
    # Every other install resolves nothing: moelora's wheel, by path, without its dependencies.
    wheel_install = "pip install --no-cache-dir --no-deps -r /wheels/operator.txt"
    assert [c for c in installs if c != lock_install] == [wheel_install]
    assert installs.index(lock_install) == 0
    mount = "--mount=type=bind,source=image/operator.lock,target=/tmp/operator.lock "
    assert any(mount in r for r in runs)
    assert any(re.search(r"&&\s+pip check\s+&&", r) for r in runs)
    assert "moelora[operator] @ file://" in DOCKERFILE.read_text()
