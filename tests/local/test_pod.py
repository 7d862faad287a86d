"""One pod's processes: a container that cannot start fails the pod at once, and no process a container forked
outlives its restart or the pod's stop (checked in /proc by session and process group)."""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import threading
import time
import types
from collections.abc import Callable

import pytest

from moelora.local import __main__ as local_main
from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.kubelet import ContainerPlan, LocalKubelet, LocalPod, PodPlan, Probe
from moelora.local.kubelet import pod as pod_module

# A container's process tree like vLLM's: a child in its process group, one in a process group of its own (same
# session), and a grandchild re-parented to init by a double fork. Each appends its pid to argv[1]/<session id>.
TREE = """
import os, sys, time
def note():
    with open(os.path.join(sys.argv[1], str(os.getsid(0))), "a") as out:
        out.write(f"{os.getpid()}\\n")
def sleeper(setup=lambda: None):
    if os.fork() == 0:
        setup(); note(); time.sleep(600); os._exit(0)
note()
sleeper()
sleeper(lambda: os.setpgid(0, 0))
if os.fork() == 0:
    sleeper()
    os._exit(0)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """True if `pid` runs (a zombie has exited)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _until(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def _trees(folder: pathlib.Path, count: int) -> list[list[int]]:
    """The pids each run of TREE wrote (its leader's first), once `count` runs have written all four."""

    def complete() -> list[list[int]] | None:
        runs = [[int(p) for p in path.read_text().split()] for path in folder.iterdir()]
        return runs if len(runs) == count and all(len(run) == 4 for run in runs) else None

    return _until(complete)


def test_a_restart_and_the_stop_leave_no_process_of_the_container(
    tmp_path: pathlib.Path, running_in: Callable[[int], list[int]]
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = PodPlan(
        name="tree",
        init_containers=(),
        containers=(ContainerPlan(name="tree", argv=(sys.executable, "-c", TREE, str(pids)), env={}),),
        volumes={},
        ports={},
    )
    pod = LocalPod(plan=plan, root=tmp_path / "pod")
    pod.start()
    try:
        ((leader, *forked),) = _trees(pids, 1)
        assert all(_alive(pid) and os.getsid(pid) == leader for pid in forked)
        assert any(os.getpgid(pid) != leader for pid in forked)  # one left the leader's process group
        os.kill(leader, signal.SIGKILL)  # the main process only, as `kill -KILL <pid>` does
        _until(lambda: pod.containers["tree"].restarts == 1)
        ((new_leader, *_),) = [run for run in _trees(pids, 2) if run[0] != leader]
        assert [pid for pid in forked if _alive(pid)] == [] and running_in(leader) == []
    finally:
        pod.stop()
    assert running_in(new_leader) == [] and running_in(leader) == []


def _deployment(containers: list[dict]) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}},
        },
    }


def test_a_container_that_cannot_start_fails_the_pod_at_once(tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "no-such-interpreter")
    containers = [
        {"name": "sidecar", "command": ["python3", "-c", "import time; time.sleep(600)"]},
        {"name": "server", "command": [missing, "-m", "http.server"]},
    ]
    with KubeAPI() as api:
        Rest(url=api.url).request(
            method="POST", path="/apis/apps/v1/namespaces/default/deployments", body=_deployment(containers)
        )
        with LocalKubelet(api_url=api.url, namespace="default", root=tmp_path / "pods") as kubelet:
            started = time.monotonic()
            with pytest.raises(RuntimeError, match=f"FileNotFoundError.*{missing}"):
                kubelet.wait_ready("web", replicas=1, timeout=60)
            # The demo's own start-up wait ends as soon, with the same error.
            local = types.SimpleNamespace(kubelet=kubelet, root=tmp_path)
            with pytest.raises(RuntimeError, match="FileNotFoundError"):
                local_main._wait_pods(local, lambda message: None, server="web", timeout=60)  # type: ignore[arg-type]
            assert time.monotonic() - started < 5
            (pod,) = kubelet.pods_of("web")
            sidecar = pod.containers["sidecar"].process
            assert sidecar is not None
            _until(lambda: sidecar.poll() is not None)  # nothing supervises it any more: stopped (a SIGTERM away)
            status = _until(lambda: (api.get("v1/pods", "default", pod.name) or {}).get("status", {}).get("message"))
            assert "FileNotFoundError" in status
            reasons = {
                c["name"]: c["state"].get("waiting", {}).get("reason")
                for c in api.get("v1/pods", "default", pod.name)["status"]["containerStatuses"]
            }
            assert reasons == {"sidecar": "RunContainerError", "server": "RunContainerError"}


def test_the_stop_does_not_wait_for_a_probe_that_hangs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM accepts connections before it answers them, so a probe can hang for its whole timeout; Ctrl-C on the local
    # stack must not wait behind it before the containers get their SIGTERM.
    probing, release = threading.Event(), threading.Event()

    def hanging_probe(url: str, *, timeout: float = 2.0) -> bool:
        probing.set()
        release.wait(60)
        return False

    monkeypatch.setattr(pod_module.process, "http_ok", hanging_probe)
    server = ContainerPlan(
        name="server",
        argv=(sys.executable, "-c", "import time; time.sleep(600)"),
        env={},
        startup=Probe(url="http://127.0.0.1:9/health"),
    )
    pod = LocalPod(
        plan=PodPlan(name="hang", init_containers=(), containers=(server,), volumes={}, ports={}), root=tmp_path
    )
    pod.start()
    stopper = threading.Thread(target=pod.stop, kwargs={"grace": 1.0})
    try:
        assert probing.wait(20)
        proc = pod.containers["server"].process
        assert proc is not None and proc.poll() is None
        stopper.start()
        _until(lambda: proc.poll() is not None)  # stopped while the probe still hangs
        assert not release.is_set() and stopper.is_alive()  # the stop then waits for the supervisor's probe
    finally:
        release.set()
        if stopper.is_alive():
            stopper.join(30)
    assert not stopper.is_alive() and not pod._thread.is_alive()
    assert pod.containers["server"].restarts == 0  # nothing started again after the stop
