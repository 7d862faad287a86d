"""README.md's "On a cluster" commands, checked against what they name: the image tags the chart and the Dockerfile
expect, and `helm install --set` keys that exist in values.yaml, rendered through the chart to the images it runs.
"""

from __future__ import annotations

import json
import re
import shlex

import helm_python as helm
import jsonschema
import yaml

from .conftest import ROOT, global_args

CHART = ROOT / "charts" / "moelora"
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def commands() -> tuple[dict[str, str], list[list[str]]]:
    """The section's shell block: its variable assignments, and its commands split into words with them expanded."""
    block = re.search(r"```sh\n(.*?)```", section("On a cluster"), flags=re.DOTALL).group(1)
    variables: dict[str, str] = {}
    result = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 1 and (match := re.fullmatch(r"([A-Z_]+)=(\S+)", words[0])):
            variables[match.group(1)] = match.group(2)
        elif words:
            result.append([re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], word) for word in words])
    return variables, result


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def key_exists(tree: object, path: str) -> bool:
    """Whether a --set key (a.b[0].c) names a value in values.yaml; below a list index the list's default is empty."""
    for part in re.split(r"\.(?![^\[]*\])", path):
        name, index = re.fullmatch(r"([^\[]+)(\[\d+\])?", part).groups()
        if not isinstance(tree, dict) or name not in tree:
            return False
        tree = tree[name]
        if index:
            return isinstance(tree, list)
    return True


def merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = merge(merged[key], value) if nested else value
    return merged


def test_the_versions_are_the_charts_and_the_dockerfiles() -> None:
    variables, _ = commands()
    assert variables["VERSION"] == yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert variables["VLLM"] == global_args()["VLLM_VERSION"]


def test_builds_and_pushes_the_tags_the_chart_expects() -> None:
    variables, lines = commands()
    built = {}
    for words in lines:
        if words[:2] == ["docker", "build"]:
            built[words[words.index("--target") + 1]] = words[words.index("-t") + 1]
            assert words[-1] == "."
    pushed = [words[2] for words in lines if words[:2] == ["docker", "push"]]
    assert sorted(pushed) == sorted(built.values())
    registry = variables["REGISTRY"]
    # The same names and tag shapes as the chart's defaults, under the user's registry path.
    for target in ("operator", "server"):
        default = values()[target]["image"]
        repository = default["repository"].replace("ghcr.io/moelora", registry)
        tag = default["tag"] or variables["VERSION"]
        assert built[target] == f"{repository}:{tag}"


def set_options(text: str) -> list[str]:
    return [words[i + 1] for words in (shlex.split(text),) for i, word in enumerate(words) if word == "--set"]


def test_every_set_key_in_the_readme_is_a_value() -> None:
    options = [
        option
        for line in README.replace("\\\n", " ").splitlines()
        for match in re.finditer(r"--set\s+('[^']*'|\S+)", line)
        for option in set_options(match.group(0))
    ]
    assert len(options) >= 6
    missing = [option for option in options if not key_exists(values(), option.split("=", 1)[0])]
    assert missing == []


def test_key_exists_would_catch_a_typo() -> None:
    assert key_exists(values(), "operator.image.repository")
    assert key_exists(values(), "operator.imagePullSecrets[0].name")
    assert not key_exists(values(), "operator.images.repository")
    assert not key_exists(values(), "server.image.repository.name")
    assert not key_exists(values(), "server.imagePullSecrets[0].name")


def test_the_install_runs_the_pushed_images() -> None:
    _, lines = commands()
    (install,) = [words for words in lines if words[:2] == ["helm", "install"]]
    overrides: dict = {}
    for option in set_options(shlex.join(install)):
        overrides = merge(overrides, helm.parse_set_string(option))
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(merge(values(), overrides), schema)
    manifests = helm.Chart.load(CHART).render(overrides, name="moelora", namespace="moelora-system")
    deployment = yaml.safe_load(manifests["moelora/templates/deployment.yaml"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    pushed = sorted(words[2] for words in lines if words[:2] == ["docker", "push"])
    assert sorted([container["image"], env["MOELORA_SERVER_IMAGE"]]) == pushed
    # The examples' namespace gets the server ServiceAccount the agent runs under.
    assert "namespace: default" in manifests["moelora/templates/rbac-server.yaml"]
