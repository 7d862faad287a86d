""".github/workflows/images.yml, checked without GitHub: it parses, builds the Dockerfile's two final targets, pins
its actions, keeps expressions out of shell scripts (which shellcheck lints), and its tag step, run here with bash,
computes the image references the chart's values.yaml installs by default.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest
import yaml

from .conftest import ROOT, check_actions_pinned, check_run_scripts, read_workflow, stages

WORKFLOW = ROOT / ".github" / "workflows" / "images.yml"
CHART = ROOT / "charts" / "moelora"


def workflow() -> dict:
    return read_workflow(WORKFLOW)


def steps() -> list[dict]:
    return [step for job in workflow()["jobs"].values() for step in job["steps"]]


def builds() -> list[dict]:
    return [step["with"] for step in steps() if step.get("uses", "").startswith("docker/build-push-action@")]


def test_triggers_release_tags_dispatch_and_reuse() -> None:
    on = workflow()["on"]
    assert on["push"] == {"tags": ["v*"]}
    dispatch, call = on["workflow_dispatch"]["inputs"], on["workflow_call"]["inputs"]
    # A caller can set everything a person can, plus which repository and ref to build.
    assert dispatch.keys() <= call.keys()
    assert {"registry", "namespace", "push", "repository", "ref"} <= call.keys()
    outputs = on["workflow_call"]["outputs"]
    assert {"operator-image", "operator-digest", "server-image", "server-digest"} <= outputs.keys()
    assert workflow()["permissions"] == {"contents": "read", "packages": "write"}


def test_builds_each_final_dockerfile_target_once() -> None:
    final = {name for name in stages() if any(i == "ENTRYPOINT" for i, _ in stages()[name])}
    assert final == {"operator", "server"}
    assert sorted(build["target"] for build in builds()) == sorted(final)
    assert all(build["context"] == "." for build in builds())
    operator = next(build for build in builds() if build["target"] == "operator")
    assert operator["platforms"].split(",") == ["linux/amd64", "linux/arm64"]
    assert operator["tags"] == "${{ needs.tags.outputs.operator }}"
    server = next(build for build in builds() if build["target"] == "server")
    assert server["tags"] == "${{ needs.tags.outputs.server }}"


def test_actions_are_pinned() -> None:
    check_actions_pinned(steps())


def test_run_scripts_take_inputs_through_env_and_pass_shellcheck(tmp_path: pathlib.Path) -> None:
    check_run_scripts(steps(), tmp_path)


def tag_step() -> dict:
    return next(step for step in workflow()["jobs"]["tags"]["steps"] if step.get("id") == "tags")


def compute_tags(tmp_path: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The tag step's script, run by bash in the repository root as the runner would."""
    output = tmp_path / "github_output"
    output.write_text("")
    return subprocess.run(
        ["bash", "-c", tag_step()["run"]],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "GITHUB_OUTPUT": str(output), "RELEASE_TAG": "false", **env},
        capture_output=True,
        text=True,
        check=False,
    )


def outputs(tmp_path: pathlib.Path) -> dict[str, str]:
    lines = (tmp_path / "github_output").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_tags_are_the_ones_the_chart_installs(tmp_path: pathlib.Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    # The defaults in values.yaml are ghcr.io/<owner>/...: the workflow's defaults with the project's owner.
    result = compute_tags(tmp_path, REGISTRY="ghcr.io", NAMESPACE="moelora")
    assert result.returncode == 0, result.stderr
    tags = outputs(tmp_path)
    operator = values["operator"]["image"]
    assert tags["operator"] == f"{operator['repository']}:{operator['tag'] or app_version}"
    server = values["server"]["image"]
    assert tags["server"] == f"{server['repository']}:{server['tag']}"
    assert tags["registry"] == "ghcr.io"
    # The step's own defaults, as the expressions in its env give them.
    step_env = tag_step()["env"]
    assert step_env["REGISTRY"].endswith("|| 'ghcr.io' }}")
    assert step_env["NAMESPACE"].endswith("|| github.repository_owner }}")


def test_tags_elsewhere_are_lower_case(tmp_path: pathlib.Path) -> None:
    result = compute_tags(tmp_path, REGISTRY="registry.example.com:5000", NAMESPACE="ML-Platform/serving")
    assert result.returncode == 0, result.stderr
    assert outputs(tmp_path)["operator"].startswith("registry.example.com:5000/ml-platform/serving/moelora-operator:")


@pytest.mark.parametrize("matches", [True, False])
def test_a_release_tag_must_be_the_chart_version(tmp_path: pathlib.Path, matches: bool) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    tag = f"v{app_version}" if matches else f"v{app_version}.1"
    result = compute_tags(tmp_path, REGISTRY="ghcr.io", NAMESPACE="moelora", RELEASE_TAG="true", REF_NAME=tag)
    assert (result.returncode == 0) is matches, result.stdout + result.stderr
    if not matches:
        assert "does not match the chart's appVersion" in result.stdout
        assert outputs(tmp_path) == {}
