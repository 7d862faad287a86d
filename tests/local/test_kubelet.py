"""The local kubelet runs a Deployment's pods from the emulator, reports them, restarts crashes, scales, cleans up."""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Iterator

import pytest

from moelora.local import process
from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.kubelet import GRACE, LocalKubelet

# An HTTP server on the port of its argument; ready once its first argument's file exists (a volume file).
SERVER = """
import http.server, os, sys
port, flag = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = os.path.exists(flag) and os.environ["POD"] == os.environ["EXPECT_POD"]
        self.send_response(200 if ok else 503); self.end_headers(); self.wfile.write(os.environ["TOKEN"].encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _deployment(replicas: int, token_key: str = "token") -> dict:
    container = {
        "name": "web",
        "command": ["python3", "-c", SERVER],
        "args": ["8000", "/data/ready"],
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "EXPECT_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "web", "key": token_key}}},
        ],
        "ports": [{"name": "http", "containerPort": 8000}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "failureThreshold": 2},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container], "volumes": [{"name": "data", "emptyDir": {}}]},
            },
        },
    }


@pytest.fixture
def api() -> Iterator[KubeAPI]:
    with KubeAPI() as running:
        yield running


def _until(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def test_kubelet_lifecycle(api: KubeAPI, tmp_path: pathlib.Path) -> None:
    rest = Rest(url=api.url)
    rest.request(
        method="POST",
        path="/api/v1/namespaces/default/secrets",
        body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "web"}, "data": {"token": "aGVsbG8="}},
    )  # "hello"
    rest.request(method="POST", path="/apis/apps/v1/namespaces/default/deployments", body=_deployment(2))
    with LocalKubelet(api_url=api.url, namespace="default", root=tmp_path) as kubelet:
        running = _until(lambda: len(kubelet.pods_of("web")) == 2 and kubelet.pods_of("web"))
        a, b = running
        assert a.plan.ports[8000] != b.plan.ports[8000]  # side by side on one machine
        _until(lambda: all(process.http_ok(p.url(8000)) is False and p.containers["web"].process for p in running))
        assert not any(p.ready for p in running)  # not ready until its volume has the file
        for p in running:
            (p.plan.volumes["data"] / "ready").write_text("")
        kubelet.wait_ready("web", replicas=2, timeout=20)
        objects = {p["metadata"]["name"]: p for p in api.list("v1/pods", "default")}
        assert set(objects) == {a.name, b.name}
        _until(
            lambda: all(
                p.get("status", {}).get("conditions", [{}])[0].get("status") == "True"
                for p in api.list("v1/pods", "default")
            )
        )
        _until(
            lambda: (
                (rest.request(method="GET", path="/apis/apps/v1/namespaces/default/deployments/web") or {})
                .get("status", {})
                .get("readyReplicas")
                == 2
            )
        )
        import urllib.request

        assert urllib.request.urlopen(a.url(8000)).read() == b"hello"

        a.kill("web")  # a crash: restarted, counted, ready again (the volume survives a container restart)
        _until(lambda: a.containers["web"].restarts == 1)
        _until(lambda: a.ready)
        _until(
            lambda: (
                [
                    c["restartCount"]
                    for c in (rest.request(method="GET", path=f"/api/v1/namespaces/default/pods/{a.name}") or {})
                    .get("status", {})
                    .get("containerStatuses", [])
                ]
                == [1]
            )
        )

        rest.request(
            method="PATCH", path="/apis/apps/v1/namespaces/default/deployments/web", body={"spec": {"replicas": 1}}
        )
        _until(lambda: len(kubelet.pods_of("web")) == 1 and len(api.list("v1/pods", "default")) == 1)

        rest.request(method="DELETE", path="/apis/apps/v1/namespaces/default/deployments/web")
        _until(lambda: not kubelet.pods_of("web") and not api.list("v1/pods", "default"))
        assert all(p.containers["web"].process.poll() is not None for p in running)


# Notes the time of its SIGTERM in argv[1] and keeps running, as vLLM does while it drains; argv[1].up once it can.
DRAINING = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: out.write_text(repr(time.monotonic())))
out.with_suffix(".up").write_text("")
time.sleep(600)
"""


def _scale_a_draining_pod_to_zero(
    api: KubeAPI, tmp_path: pathlib.Path, *, grace: int, lifecycle: dict | None = None
) -> tuple[int | None, float, float, float]:
    """One pod of DRAINING with `grace` (and `lifecycle`), scaled to zero: its exit status and the monotonic times of
    the scale-down, its SIGTERM and its exit."""
    rest = Rest(url=api.url)
    noted = tmp_path / "sigterm"
    container_spec: dict = {"name": "drain", "command": ["python3", "-c", DRAINING], "args": [str(noted)]}
    if lifecycle:
        container_spec["lifecycle"] = lifecycle
    body = _deployment(1)
    body["spec"]["template"]["spec"] = {"terminationGracePeriodSeconds": grace, "containers": [container_spec]}
    rest.request(method="POST", path="/apis/apps/v1/namespaces/default/deployments", body=body)
    with LocalKubelet(api_url=api.url, namespace="default", root=tmp_path / "kubelet") as kubelet:
        (pod,) = _until(lambda: kubelet.pods_of("web"))
        _until(lambda: noted.with_suffix(".up").exists())
        container = pod.containers["drain"].process
        assert container is not None
        deleted = time.monotonic()
        rest.request(
            method="PATCH", path="/apis/apps/v1/namespaces/default/deployments/web", body={"spec": {"replicas": 0}}
        )
        _until(lambda: container.poll() is not None, timeout=GRACE + 10)
        exited = time.monotonic()
    return container.returncode, deleted, float(noted.read_text()), exited


def test_a_deleted_pod_gets_its_grace_period_from_sigterm_to_sigkill(api: KubeAPI, tmp_path: pathlib.Path) -> None:
    status, _, sigterm, exited = _scale_a_draining_pod_to_zero(api, tmp_path, grace=2)
    # SIGTERM first, SIGKILL once the pod's own grace period has passed: not at once, nor after the node's GRACE.
    assert status == -signal.SIGKILL
    assert 1.5 <= exited - sigterm < GRACE / 2


def test_a_deleted_pods_prestop_sleep_comes_before_sigterm_within_its_grace_period(
    api: KubeAPI, tmp_path: pathlib.Path
) -> None:
    hook = {"preStop": {"sleep": {"seconds": 2}}}
    status, deleted, sigterm, killed = _scale_a_draining_pod_to_zero(api, tmp_path, grace=4, lifecycle=hook)
    # The hook's sleep, then SIGTERM; then SIGKILL once the grace period, which counts the sleep, is over.
    assert sigterm - deleted >= 2
    assert status == -signal.SIGKILL
    assert 1.5 <= killed - sigterm < 3


def test_missing_secret_key_fails_the_pod(api: KubeAPI, tmp_path: pathlib.Path) -> None:
    rest = Rest(url=api.url)
    rest.request(
        method="POST", path="/apis/apps/v1/namespaces/default/deployments", body=_deployment(1, token_key="absent")
    )
    with LocalKubelet(api_url=api.url, namespace="default", root=tmp_path) as kubelet:
        with pytest.raises(RuntimeError, match="absent"):
            kubelet.wait_ready("web", replicas=1, timeout=10)
        _until(
            lambda: (
                (api.list("v1/pods", "default") or [{}])[0]
                .get("status", {})
                .get("message", "")
                .endswith("has no key 'absent'")
            )
        )


def _claim(name: str, storage_class: str | None = None) -> dict:
    spec: dict = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def _job(name: str, claim: str, code: str) -> dict:
    container = {
        "name": "fill",
        "command": ["python3", "-c", code],
        "args": ["/out/weights"],
        "volumeMounts": [{"name": "out", "mountPath": "/out"}],
    }
    pod = {"restartPolicy": "Never", "containers": [container]}
    pod["volumes"] = [{"name": "out", "persistentVolumeClaim": {"claimName": claim}}]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"template": {"spec": pod}}}


def _job_condition(api: KubeAPI, name: str) -> dict | None:
    job = api.get("batch/v1/jobs", "default", name) or {}
    return next(iter((job.get("status") or {}).get("conditions") or []), None)


def test_claims_are_bound_to_folders_and_jobs_run_once(api: KubeAPI, tmp_path: pathlib.Path) -> None:
    rest = Rest(url=api.url)
    claims, jobs = "/api/v1/namespaces/default/persistentvolumeclaims", "/apis/batch/v1/namespaces/default/jobs"
    for claim in (_claim("cache"), _claim("nowhere", storage_class="no-such-class")):
        rest.request(method="POST", path=claims, body=claim)
    counter = tmp_path / "runs"
    write = f"import sys; open(sys.argv[1], 'w').write('w'); open({str(counter)!r}, 'a').write('x')"
    rest.request(method="POST", path=jobs, body=_job("fill", "cache", write))
    rest.request(method="POST", path=jobs, body=_job("broken", "cache", "raise SystemExit(3)"))
    rest.request(method="POST", path=jobs, body=_job("stuck", "nowhere", write))
    with LocalKubelet(api_url=api.url, namespace="default", root=tmp_path / "kubelet"):
        done = _until(lambda: _job_condition(api, "fill"))
        assert done["type"] == "Complete" and api.get("batch/v1/jobs", "default", "fill")["status"]["succeeded"] == 1
        failed = _until(lambda: _job_condition(api, "broken"))
        assert failed["type"] == "Failed" and "exited with 3" in failed["message"]
        time.sleep(1.5)  # a few more rounds: a finished Job is not run again, an unbound claim stays Pending
        assert counter.read_text() == "x"
        assert (tmp_path / "kubelet" / "claims" / "cache" / "weights").read_text() == "w"
        assert api.get("v1/persistentvolumeclaims", "default", "cache")["status"]["phase"] == "Bound"
        assert (api.get("v1/persistentvolumeclaims", "default", "nowhere").get("status") or {}).get("phase") != "Bound"
        assert _job_condition(api, "stuck") is None
