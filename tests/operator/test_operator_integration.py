"""ModelServers through the real kopf operator against the emulated API server over HTTP, driven with kubectl.

One API server and one operator for the module (starting kopf is the slow part); each test works in its own
namespace so they cannot see each other's objects. The emulator has no Deployment controller and no kubelet: where
a test needs a rollout or a ready pod, it writes their status itself, as those controllers would.
"""

from __future__ import annotations

import copy
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local import process
from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread

from .cluster import DEPLOYMENTS, EXAMPLES, MS, PDBS, apply, condition, manifest, wait_for
from .conftest import running_operator


@pytest.fixture(scope="module")
def operator(kube: KubeAPI) -> Iterator[OperatorThread]:
    liveness = f"http://127.0.0.1:{process.free_port()}/healthz"
    with running_operator(kube, resync_seconds=1.0, liveness_endpoint=liveness) as running:
        yield running


def vllm_args(deployment: dict[str, Any]) -> list[str]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")["args"]


def events(kube: KubeAPI, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1/events", namespace) if e.get("involvedObject", {}).get("name") == name]


def test_apply_update_delete_through_kubectl(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "default"  # the example's own namespace: applied as the file a user would apply
    kube.kubectl("apply", "-f", str(EXAMPLES / "modelserver.yaml"))
    server = wait_for(lambda: kube.get(MS, ns, "qwen-moe"), what="the ModelServer")
    dep = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment")
    svc = wait_for(lambda: kube.get("v1/services", ns, "qwen-moe"), what="the Service")

    args = vllm_args(dep)
    assert args[:2] == ["--model", "Qwen/Qwen1.5-MoE-A2.7B-Chat"]
    assert "--enable-lora" in args and args[-1] == "--max-model-len=8192"
    for child in (dep, svc):  # deletion cascades through these
        [owner] = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("ModelServer", "qwen-moe", server["metadata"]["uid"])
        assert owner["controller"] is True
    status = wait_for(
        lambda: (s := kube.get(MS, ns, "qwen-moe")) and s.get("status", {}).get("endpoint") and s, what="status"
    )["status"]
    assert status["endpoint"] == "http://qwen-moe.default.svc:8000/v1" and status["observedGeneration"] == 1
    assert condition({"status": status}, "Progressing")["reason"] == "RollingOut"

    # kubectl reads our objects back (list kinds, printer-free output) and sees the status subresource.
    got = json.loads(kube.kubectl("get", "ms", "-n", ns, "-o", "json").stdout)
    assert [item["metadata"]["name"] for item in got["items"]] == ["qwen-moe"]

    # An update rolls the Deployment.
    apply(kube, manifest("modelserver.yaml", namespace=ns, engineArgs=["--max-model-len=4096"], replicas=2))
    rolled = wait_for(
        lambda: (d := kube.get(DEPLOYMENTS, ns, "qwen-moe")) and "--max-model-len=4096" in vllm_args(d) and d,
        what="the rolled Deployment",
    )
    assert rolled["spec"]["replicas"] == 2 and "--max-model-len=8192" not in vllm_args(rolled)
    wait_for(
        lambda: (kube.get(MS, ns, "qwen-moe") or {}).get("status", {}).get("observedGeneration") == 2,
        what="observedGeneration 2",
    )
    assert len(kube.list(DEPLOYMENTS, ns)) == 1 and len(kube.list("v1/services", ns)) == 1

    # Delete: the API server's garbage collector (emulated by moelora.local.apiserver) removes what the server owned.
    kube.kubectl("delete", "ms", "qwen-moe", "-n", ns, "--wait=true", "--timeout=20s")
    wait_for(
        lambda: (
            kube.get(DEPLOYMENTS, ns, "qwen-moe") is None and kube.get("v1/services", ns, "qwen-moe") is None or None
        ),
        what="cascading deletion",
    )
    assert kube.get(MS, ns, "qwen-moe") is None


def test_reconcile_is_idempotent_and_repairs_drift(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "idem"
    apply(kube, manifest("modelserver.yaml", namespace=ns))
    wait_for(lambda: (kube.get(MS, ns, "qwen-moe") or {}).get("status", {}).get("endpoint"), what="status")
    dep = kube.get(DEPLOYMENTS, ns, "qwen-moe")
    server = kube.get(MS, ns, "qwen-moe")
    # Someone else's annotation on our Deployment must survive our reconciles.
    kube.kubectl("annotate", "deployment", "qwen-moe", "-n", ns, "team.example.com/owner=ml")
    annotated = kube.get(DEPLOYMENTS, ns, "qwen-moe")
    # A label change on the server fires its update handler; the resync timer runs every second.
    kube.kubectl("label", "ms", "qwen-moe", "-n", ns, "team=ml")
    time.sleep(2.5)
    after = kube.get(DEPLOYMENTS, ns, "qwen-moe")
    assert after["metadata"]["resourceVersion"] == annotated["metadata"]["resourceVersion"], "rewritten needlessly"
    assert after["metadata"]["annotations"]["team.example.com/owner"] == "ml"
    assert after["spec"] == dep["spec"]
    final = kube.get(MS, ns, "qwen-moe")
    # The status was written once: only the label change moved the server's resourceVersion since.
    assert final["status"] == server["status"]
    assert len(kube.list(DEPLOYMENTS, ns)) == 1

    # Drift: a hand edit of fields we own (replicas, the vLLM image) is put back, prompted by the edit's own watch
    # event (the resync timer of this fixture would also do it: the assertion allows less than its period).
    containers = copy.deepcopy(after["spec"]["template"]["spec"]["containers"])
    containers[0]["image"] = "evil.example.com/vllm:latest"
    kube.kubectl(
        "patch",
        "deployment",
        "qwen-moe",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"replicas": 5, "template": {"spec": {"containers": containers}}}}),
    )
    repaired = wait_for(
        lambda: (d := kube.get(DEPLOYMENTS, ns, "qwen-moe"))["spec"] == dep["spec"] and d,
        timeout=5,
        what="the hand edit reverted",
    )
    assert repaired["metadata"]["annotations"]["team.example.com/owner"] == "ml"
    settled = repaired["metadata"]["resourceVersion"]
    time.sleep(2.5)  # reverted once, then left alone: no patch loop
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe")["metadata"]["resourceVersion"] == settled

    # Drift: a deleted Deployment comes back.
    kube.kubectl("delete", "deployment", "qwen-moe", "-n", ns)
    back = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the re-created Deployment")
    assert back["metadata"]["uid"] != dep["metadata"]["uid"] and back["spec"] == dep["spec"]


def test_liveness_endpoint_answers_while_the_operator_runs(operator: OperatorThread) -> None:
    # What the chart's livenessProbe asks (kopf serves it; a wedged event loop stops answering and the pod restarts).
    # kopf starts the server as one of its root tasks, possibly just after it reports ready: allow a moment.
    def answer() -> tuple[int, bytes] | None:
        try:
            with urllib.request.urlopen(operator.settings.liveness_endpoint, timeout=5) as response:
                return response.status, response.read()
        except ConnectionRefusedError:
            return None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                return None
            raise

    code, body = wait_for(answer, what="the liveness endpoint")
    assert code == 200 and isinstance(json.loads(body), dict)


def test_status_follows_the_deployment(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "rollout"
    apply(kube, manifest("modelserver.yaml", namespace=ns))
    dep = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment")
    # What the Deployment controller would write once the pod is up.
    controller_status = {
        "status": {
            "observedGeneration": dep["metadata"]["generation"],
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
        }
    }
    kube.kubectl(
        "patch",
        "deployment",
        "qwen-moe",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(controller_status),
    )
    ready = wait_for(
        lambda: (c := condition(kube.get(MS, ns, "qwen-moe"), "Ready")) and c["status"] == "True" and c, what="Ready"
    )
    assert ready["reason"] == "AllReplicasReady"
    server = kube.get(MS, ns, "qwen-moe")
    assert condition(server, "Progressing")["reason"] == "RolledOut"
    assert server["status"]["readyReplicas"] == 1
    # kubectl wait works on our conditions too.
    kube.kubectl("wait", "ms/qwen-moe", "-n", ns, "--for=condition=Ready", "--timeout=10s")


def test_operator_judged_errors_become_conditions_and_events(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "bad"
    apply(kube, manifest("modelserver.yaml", namespace=ns))
    good = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the good Deployment")
    wait_for(lambda: condition(kube.get(MS, ns, "qwen-moe"), "Progressing"), what="good status")
    good_server = kube.get(MS, ns, "qwen-moe")

    typo = manifest("modelserver.yaml", namespace=ns, engineArgs=["--max-modle-len=8192"])
    typo["metadata"]["name"] = "typo"
    apply(kube, typo)
    degraded = wait_for(
        lambda: (c := condition(kube.get(MS, ns, "typo"), "Degraded")) and c["status"] == "True" and c, what="Degraded"
    )
    assert degraded["reason"] == "UnknownEngineFlag" and "--max-modle-len" in degraded["message"]
    warning = wait_for(
        lambda: [e for e in events(kube, ns, "typo") if e["reason"] == "UnknownEngineFlag"], what="the Event"
    )
    assert warning[0]["type"] == "Warning"
    assert kube.get(DEPLOYMENTS, ns, "typo") is None  # nothing rendered from a refused spec

    missing = manifest("modelserver.yaml", namespace=ns, s3={"credentialsSecret": {"name": "nope"}})
    missing["metadata"]["name"] = "nosecret"
    apply(kube, missing)
    reason = wait_for(lambda: (c := condition(kube.get(MS, ns, "nosecret"), "Degraded")) and c["reason"], what="why")
    assert reason == "SecretNotFound"
    wait_for(lambda: [e for e in events(kube, ns, "nosecret") if e["reason"] == "SecretNotFound"], what="the Event")
    # Once the Secret exists, the resync picks it up.
    kube.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "nope", "namespace": ns},
                "stringData": {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"},
            }
        ),
    )
    wait_for(lambda: kube.get(DEPLOYMENTS, ns, "nosecret"), what="the Deployment after the Secret appeared")

    # A bad update of a running server keeps its Deployment as it was.
    apply(kube, manifest("modelserver.yaml", namespace=ns, engineArgs=["--port=9000"]))
    wait_for(
        lambda: (c := condition(kube.get(MS, ns, "qwen-moe"), "Degraded")) and c["reason"] == "ManagedEngineFlag",
        what="ManagedEngineFlag",
    )
    kept = kube.get(DEPLOYMENTS, ns, "qwen-moe")
    assert kept["spec"] == good["spec"] and kept["metadata"]["resourceVersion"] == good["metadata"]["resourceVersion"]
    assert kube.get(MS, ns, "qwen-moe")["metadata"]["uid"] == good_server["metadata"]["uid"]
    # One event per new reason, not one per reconcile.
    time.sleep(1.5)
    assert len([e for e in events(kube, ns, "typo") if e["reason"] == "UnknownEngineFlag"]) == 1


def test_gated_model_token_and_refused_security_overrides(kube: KubeAPI, operator: OperatorThread) -> None:
    ns, token = "gated", "hf_integrationTOKENmustNeverLeak0001"
    gated = manifest("modelserver.yaml", namespace=ns, model={"name": "org/gated", "tokenSecret": {"name": "hf"}})
    gated["metadata"]["name"] = "gated"
    apply(kube, gated)
    degraded = wait_for(
        lambda: (c := condition(kube.get(MS, ns, "gated"), "Degraded")) and c["status"] == "True" and c, what="why"
    )
    assert degraded["reason"] == "SecretNotFound" and "Hugging Face token" in degraded["message"]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": ns}}
    kube.kubectl("apply", "-f", "-", stdin=json.dumps({**secret, "stringData": {"HF_TOKEN": token}}))
    good = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "gated"), what="the Deployment after the Secret appeared")
    vllm = next(c for c in good["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}} in vllm["env"]

    # An override the restricted profile forbids: a verdict and a Warning, the running Deployment untouched.
    apply(kube, {**gated, "spec": {**gated["spec"], "securityContext": {"privileged": True}}})
    verdict = wait_for(
        lambda: (c := condition(kube.get(MS, ns, "gated"), "Degraded")) and c["reason"] == "PodSecurityViolation" and c,
        what="PodSecurityViolation",
    )
    assert "privileged" in verdict["message"]
    wait_for(lambda: [e for e in events(kube, ns, "gated") if e["reason"] == "PodSecurityViolation"], what="Event")
    kept = kube.get(DEPLOYMENTS, ns, "gated")
    assert kept["metadata"]["resourceVersion"] == good["metadata"]["resourceVersion"]
    everything = json.dumps([kept, kube.get(MS, ns, "gated"), kube.list("v1/events", ns)])
    assert token not in everything


def test_schema_rejects_what_a_real_server_would(kube: KubeAPI, operator: OperatorThread) -> None:
    bad = manifest("modelserver.yaml", namespace="schema", lora={"maxLoras": 8, "maxLoraRank": 7})
    result = apply(kube, bad, check=False)
    assert result.returncode != 0 and "maxLoraRank" in result.stderr
    cel = manifest("modelserver.yaml", namespace="schema", lora={"maxLoras": 8, "maxCpuLoras": 2})
    result = apply(kube, cel, check=False)
    assert result.returncode != 0 and "maxCpuLoras must be at least maxLoras" in result.stderr
    assert kube.get(MS, "schema", "qwen-moe") is None


def test_kubectl_scale_goes_through_the_scale_subresource(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "scale"
    apply(kube, manifest("modelserver.yaml", namespace=ns))
    wait_for(lambda: kube.get(DEPLOYMENTS, ns, "qwen-moe"), what="the Deployment")
    assert kube.get(PDBS, ns, "qwen-moe") is None  # one replica: no budget that would block its node's drain
    kube.kubectl("scale", "ms/qwen-moe", "-n", ns, "--replicas=3")
    scaled = wait_for(
        lambda: (d := kube.get(DEPLOYMENTS, ns, "qwen-moe")) and d["spec"]["replicas"] == 3 and d, what="3 replicas"
    )
    assert scaled["spec"]["replicas"] == 3
    scale = json.loads(
        kube.kubectl("get", "--raw", f"/apis/moelora.io/v1alpha1/namespaces/{ns}/modelservers/qwen-moe/scale").stdout
    )
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    wait_for(
        lambda: (
            json.loads(
                kube.kubectl(
                    "get", "--raw", f"/apis/moelora.io/v1alpha1/namespaces/{ns}/modelservers/qwen-moe/scale"
                ).stdout
            )["status"].get("selector")
            == "moelora.io/model-server=qwen-moe"
        ),
        what="the selector an HPA needs",
    )

    # Three replicas: a PodDisruptionBudget lets drains take them one at a time; back to one: it goes again.
    budget = wait_for(lambda: kube.get(PDBS, ns, "qwen-moe"), what="the PodDisruptionBudget")
    server = kube.get(MS, ns, "qwen-moe")
    assert budget["spec"]["maxUnavailable"] == 1
    assert [ref["uid"] for ref in budget["metadata"]["ownerReferences"]] == [server["metadata"]["uid"]]
    pod_labels = scaled["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    kube.kubectl("scale", "ms/qwen-moe", "-n", ns, "--replicas=1")
    wait_for(lambda: kube.get(PDBS, ns, "qwen-moe") is None or None, what="the budget deleted at one replica")
    assert kube.get(DEPLOYMENTS, ns, "qwen-moe")["spec"]["replicas"] == 1


def test_a_compile_cache_claim_is_mounted_once_it_exists(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "compiled"
    server = manifest("modelserver.yaml", namespace=ns, kernels={"compileCache": {"claimName": "kernels"}})
    server["metadata"]["name"] = "cached"
    apply(kube, server)
    degraded = wait_for(
        lambda: (c := condition(kube.get(MS, ns, "cached"), "Degraded")) and c["status"] == "True" and c, what="why"
    )
    assert degraded["reason"] == "ClaimNotFound" and "kernels.compileCache" in degraded["message"]
    assert kube.get(DEPLOYMENTS, ns, "cached") is None
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "kernels", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(claim))
    rendered = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "cached"), what="the Deployment after the claim appeared")
    volumes = rendered["spec"]["template"]["spec"]["volumes"]
    assert {"name": "compile-cache", "persistentVolumeClaim": {"claimName": "kernels"}} in volumes
