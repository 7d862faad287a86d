"""Real kubectl against the emulator prints, validates and explains as it does against a cluster.

`kubectl get` prints the CRDs' printer columns (server-side Tables), `kubectl apply` validates (strict field
validation, announced in OpenAPI v3) and `kubectl explain` reads the pydantic models' descriptions.
"""

from __future__ import annotations

import json
import pathlib
import queue
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from moelora.api.model_server import LoRASpec
from moelora.local import manifests
from moelora.local.apiserver import KubeAPI
from moelora.local.apiserver.kubectl import clean_env, kubectl_binary

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "local"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with KubeAPI() as api:
        yield api


def _apply_examples(kube: KubeAPI, namespace: str) -> None:
    result = kube.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES))
    assert "modelserver.moelora.io/tiny-moe created" in result.stdout


def _status(kube: KubeAPI, namespace: str, kind: str, name: str, status: dict) -> None:
    patch = json.dumps({"status": status})
    kube.kubectl("patch", kind, name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)


def _table(text: str) -> list[list[str]]:
    """kubectl's columns split on runs of two or more spaces (cells here have no double spaces)."""
    return [[cell for cell in line.split("  ") if cell.strip()] for line in text.splitlines() if line.strip()]


def _cells(row: list[str]) -> list[str]:
    return [cell.strip() for cell in row]


LOADED = {
    "phase": "Loaded",
    "loadedReplicas": 2,
    "desiredReplicas": 3,
    "rank": 8,
    "conditions": [{"type": "Ready", "status": "True", "reason": "Loaded", "message": ""}],
}


def test_get_prints_the_printer_columns(kube: KubeAPI) -> None:
    _apply_examples(kube, "cols")
    _status(kube, "cols", "lora", "alpha", LOADED)
    _status(kube, "cols", "ms", "tiny-moe", {"readyReplicas": 1, "adapters": {"loaded": 1, "desired": 2}})

    lines = _table(kube.kubectl("get", "lora", "-n", "cols").stdout)
    assert _cells(lines[0]) == ["NAME", "SERVER", "PHASE", "LOADED", "DESIRED", "RANK", "REASON", "ROLLUP", "AGE"]
    alpha = _cells(next(row for row in lines if row[0].strip() == "alpha"))
    assert alpha[:7] == ["alpha", "tiny-moe", "Loaded", "2", "3", "8", "Loaded"]
    assert alpha[7].endswith("s")  # an age, rendered by the server like kubectl does: "3s"
    beta = _cells(next(row for row in lines if row[0].strip() == "beta"))
    assert beta[:2] == ["beta", "tiny-moe"] and len(beta) == 3  # unset columns print empty

    both = kube.kubectl("get", "ms,lora", "-n", "cols").stdout
    assert both.splitlines()[0].split() == ["NAME", "MODEL", "REPLICAS", "READY", "ADAPTERS", "STATUS", "AGE"]
    assert "modelserver.moelora.io/tiny-moe" in both and "loraadapter.moelora.io/alpha" in both
    server = _cells(_table(both)[1])
    assert server[:5] == ["modelserver.moelora.io/tiny-moe", "moelora/tiny-qwen3-moe", "1", "1", "1"]


def test_get_prints_built_in_kinds_columns(kube: KubeAPI) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "builtin"},
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    kube.kubectl(
        "patch", "pod", "p1", "-n", "builtin", "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": {"phase": "Running", "containerStatuses": [
            {"name": "a", "ready": True, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}},
            {"name": "b", "ready": False, "restartCount": 2, "image": "y", "imageID": "",
             "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        ]}}),
    )  # fmt: skip
    pods = _table(kube.kubectl("get", "pods", "-n", "builtin").stdout)
    assert _cells(pods[0]) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert _cells(pods[1])[:4] == ["p1", "1/2", "CrashLoopBackOff", "2"]

    _apply_examples(kube, "builtin")
    secrets = _table(kube.kubectl("get", "secrets", "-n", "builtin").stdout)
    assert [_cells(row)[:3] for row in secrets[:2]] == [["NAME", "TYPE", "DATA"], ["local-s3", "Opaque", "2"]]


def test_get_events_prints_what_happened_to_which_object(kube: KubeAPI) -> None:
    """The columns of kube-apiserver's event printer: wide ones only with -o wide, the reporting component standing
    in for an empty source, a singleton without a count counted once."""
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "qwen-moe.1", "namespace": "events"},
        "involvedObject": {"apiVersion": "moelora.io/v1alpha1", "kind": "ModelServer", "name": "qwen-moe"},
        "type": "Warning",
        "reason": "NameTaken",
        "message": "Service qwen-moe exists and is not owned by this ModelServer \n",
        "eventTime": "2020-01-01T00:00:00.000000Z",
        "reportingComponent": "moelora",
        "reportingInstance": "op-1",
    }
    kube.kubectl("create", "-f", "-", stdin=json.dumps(event))
    rows = _table(kube.kubectl("get", "events", "-n", "events").stdout)
    assert _cells(rows[0]) == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    last_seen, *rest = _cells(rows[1])
    assert last_seen.endswith(("d", "y")) and rest == [  # since eventTime, as firstTimestamp is unset
        "Warning",
        "NameTaken",
        "modelserver/qwen-moe",
        "Service qwen-moe exists and is not owned by this ModelServer",
    ]
    wide = _table(kube.kubectl("get", "events", "-n", "events", "-o", "wide").stdout)
    assert _cells(wide[0]) == [
        "LAST SEEN", "TYPE", "REASON", "OBJECT", "SUBOBJECT", "SOURCE", "MESSAGE", "FIRST SEEN", "COUNT", "NAME",
    ]  # fmt: skip
    assert _cells(wide[1])[4:] == [
        "moelora, op-1",  # no SUBOBJECT: the empty cell leaves no text
        "Service qwen-moe exists and is not owned by this ModelServer",
        last_seen,
        "1",
        "qwen-moe.1",
    ]


def _watch_lines(kube: KubeAPI, *args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    env = {**clean_env(), "KUBECONFIG": str(kube.kubeconfig)}
    process = subprocess.Popen(
        [kubectl_binary(), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return process, lines


def test_get_watch_streams_rows(kube: KubeAPI, tmp_path: pathlib.Path) -> None:
    _apply_examples(kube, "watch")
    process, lines = _watch_lines(kube, "get", "lora", "-n", "watch", "-w", f"--cache-dir={tmp_path}")
    try:
        first = [lines.get(timeout=20).split() for _ in range(3)]
        assert first[0][:3] == ["NAME", "SERVER", "PHASE"]
        assert sorted(row[0] for row in first[1:]) == ["alpha", "beta"]
        _status(kube, "watch", "lora", "beta", LOADED)
        changed = lines.get(timeout=20).split()
        assert changed[:7] == ["beta", "tiny-moe", "Loaded", "2", "3", "8", "Loaded"]  # a row, no second header
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_apply_validates_and_refuses_unknown_fields(kube: KubeAPI) -> None:
    _apply_examples(kube, "strict")  # validation is on: kubectl asks the server for strict field validation
    bad = {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "typo", "namespace": "strict"},
        "spec": {"model": {"name": "org/m"}, "lora": {"maxLora": 4}, "bogus": 1},
    }
    refused = kube.kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert refused.returncode == 1
    assert (
        'Error from server (BadRequest): error when creating "STDIN": ModelServer in version "v1alpha1" cannot be '
        'handled as a ModelServer: strict decoding error: unknown field "spec.bogus", unknown field '
        '"spec.lora.maxLora"'
    ) in refused.stderr
    assert kube.get("moelora.io/v1alpha1/modelservers", "strict", "typo") is None

    # An existing object: the patch kubectl sends is checked the same way.
    changed = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "local-s3", "namespace": "strict"}}
    refused = kube.kubectl("apply", "-f", "-", stdin=json.dumps({**changed, "strngData": {}}), check=False)
    assert refused.returncode == 1 and 'unknown field "strngData"' in refused.stderr

    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "strict"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": "Never", "port": 80}]},
            },
        },
    }
    refused = kube.kubectl("apply", "-f", "-", stdin=json.dumps(deployment), check=False)
    assert 'unknown field "spec.template.spec.containers[0].port"' in refused.stderr
    del deployment["spec"]["template"]["spec"]["containers"][0]["port"]
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
    assert _cells(_table(kube.kubectl("get", "deploy", "-n", "strict").stdout)[0])[:4] == [
        "NAME",
        "READY",
        "UP-TO-DATE",
        "AVAILABLE",
    ]


def test_a_refused_object_names_each_invalid_field(kube: KubeAPI) -> None:
    """The 422 is errors.NewInvalid's: kubectl prints the kind, the name, and each cause's field with its message."""
    server = {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "wrong", "namespace": "invalid"},
        "spec": {"model": {"name": "org/m"}, "gpus": 99},
    }
    refused = kube.kubectl("apply", "-f", "-", stdin=json.dumps(server), check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        'The ModelServer "wrong" is invalid: spec.gpus: Invalid value: 99: spec.gpus in body should be less than or '
        "equal to 16"
    )
    server["spec"] = {"model": {"name": "org/m"}, "lora": {"maxLoras": 8, "maxCpuLoras": 4}}  # a CEL rule's refusal
    refused = kube.kubectl("create", "-f", "-", stdin=json.dumps(server), check=False)
    assert refused.stderr.strip() == (
        'The ModelServer "wrong" is invalid: spec.lora.maxCpuLoras: Invalid value: maxCpuLoras must be at least '
        "maxLoras"
    )
    request = urllib.request.Request(
        f"{kube.url}/apis/moelora.io/v1alpha1/namespaces/invalid/modelservers",
        data=json.dumps(server).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refusal:
        urllib.request.urlopen(request, timeout=30)
    assert refusal.value.code == 422
    status = json.loads(refusal.value.read())
    assert status["message"] == (
        'ModelServer.moelora.io "wrong" is invalid: spec.lora.maxCpuLoras: Invalid value: maxCpuLoras must be at '
        "least maxLoras"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: maxCpuLoras must be at least maxLoras",  # an object's value is omitted
            "field": "spec.lora.maxCpuLoras",  # the rule's fieldPath
        }
    ]
    assert (status["details"]["kind"], status["details"]["group"], status["details"]["name"]) == (
        "ModelServer",
        "moelora.io",
        "wrong",
    )


def test_apply_accepts_what_the_local_stack_applies(kube: KubeAPI) -> None:
    """The e2e tests and the demo apply these builders' objects with validation on."""
    objects = [
        manifests.model_server(name="moe", s3_endpoint="http://127.0.0.1:9", moe=True),
        manifests.model_server(name="dense", s3_endpoint="http://127.0.0.1:9", replicas=2),
        manifests.adapter(name="a", model_server="moe", uri=manifests.adapter_uri("a"), pin={"etag": "abc"}),
        manifests.s3_secret(access_key_id="a", secret_access_key="b"),
    ]
    stdin = "\n".join(json.dumps(obj) for obj in objects)
    assert kube.kubectl("apply", "-n", "builders", "-f", "-", stdin=stdin).stdout.count("created") == 4


def _words(text: str) -> str:
    return " ".join(text.split())


def test_explain_prints_the_models_descriptions(kube: KubeAPI) -> None:
    out = _words(kube.kubectl("explain", "modelserver.spec.lora").stdout)
    assert "KIND: ModelServer" in out and "FIELD: lora <Object>" in out
    assert _words(LoRASpec.__doc__ or "") in out
    assert f"maxLoras <integer> {_words(LoRASpec.model_fields['max_loras'].description or '')}" in out

    replicas = _words(kube.kubectl("explain", "deployment.spec.replicas").stdout)
    assert "FIELD: replicas <integer>" in replicas and "Number of desired pods." in replicas


def test_apply_takes_any_field_of_a_kind_without_a_schema(kube: KubeAPI) -> None:
    """kopf's peerings have no schema here; their OpenAPI says "any field", as kopf's CRDs do, so apply validates."""
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "p", "namespace": "strict"}}
    kube.kubectl("apply", "-f", "-", stdin=json.dumps({**peering, "status": {"anything": {"goes": 1}}}))
    assert kube.get("kopf.dev/v1/kopfpeerings", "strict", "p") is not None
