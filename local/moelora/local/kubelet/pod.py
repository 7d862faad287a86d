"""One pod's containers as local processes, supervised: init containers, restarts, probes.

Init containers run first, one after another, and must exit 0. Containers that exit are restarted (the
restartPolicy Always of a Deployment), counted in `restarts`. Each container leads a session of its own; before one
restarts, whatever is left in its session is killed (vLLM's engine core and workers, which a container runtime kills
with the container's PID namespace), and stopping the pod stops every process of every session, each container's
once its preStop sleep is over. Probes: the startupProbe must pass before the readinessProbe is polled; readiness
turns true on the first success and false after `failureThreshold` consecutive failures. Probes are polled every
`PROBE_INTERVAL` s rather than `periodSeconds`, so tests are fast; liveness probes are not acted on (a crash is what
restarts a container here).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import pathlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from moelora.local import process
from moelora.local.kubelet.plan import ContainerPlan, PodPlan

log = logging.getLogger("moelora.local.kubelet")

PROBE_INTERVAL = 0.5
# Seconds from SIGTERM to SIGKILL when the whole local node stops (a deleted pod gets its own grace, `PodPlan.grace`):
# shorter than the rendered one, as vLLM exits within a few seconds of SIGTERM once it serves and ignores it while
# it loads.
GRACE = 20.0
# What a kubelet still gives a container from SIGTERM to SIGKILL when its preStop hook took the whole grace period.
MIN_GRACE_AFTER_PRE_STOP = 2.0


@dataclasses.dataclass
class ContainerState:
    """What the supervisor knows of one container: its current process, probe results and restarts."""

    plan: ContainerPlan
    process: subprocess.Popen[bytes] | None = None
    started: bool = False  # startupProbe passed (or there is none)
    ready: bool = False
    failures: int = 0
    restarts: int = 0
    log_path: pathlib.Path = pathlib.Path()


class LocalPod:
    """One pod's containers as processes, with a supervisor thread (init containers, restarts, probes).

    `ready` is the pod's Ready condition; `error` is set if it could not start (e.g. an init container failed).
    """

    def __init__(self, *, plan: PodPlan, root: pathlib.Path, on_change: Callable[[], None] = lambda: None) -> None:
        self.plan = plan
        self.root = root
        self.on_change = on_change
        self.containers = {
            c.name: ContainerState(plan=c, log_path=root / "logs" / f"{c.name}.log") for c in plan.containers
        }
        self.error: str | None = None
        self.waiting_reason: str | None = None  # set with `error` when the pod never started
        self.ready = False
        self._stop = threading.Event()
        self._grace = GRACE  # what `stop_pods` gave, for an init container the supervisor stops itself
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"pod-{plan.name}", daemon=True)

    @property
    def name(self) -> str:
        return self.plan.name

    def url(self, container_port: int) -> str:
        """http://127.0.0.1:<local port> for a containerPort of this pod."""
        return f"http://127.0.0.1:{self.plan.ports[container_port]}"

    def log(self, container: str) -> str:
        path = self.root / "logs" / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        for path in self.plan.volumes.values():
            path.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self, *, grace: float = GRACE) -> None:
        """Stop the supervisor, then every container: SIGTERM, and SIGKILL after `grace` s."""
        stop_pods([self], grace=grace)

    def kill(self, container: str) -> None:
        """Kill one container's process group (SIGKILL), as an OOM kill would; the supervisor restarts it."""
        with self._lock:
            proc = self.containers[container].process
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    def _spawn(self, state: ContainerState) -> None:
        state.process = process.spawn(argv=state.plan.argv, env=state.plan.env, log_path=state.log_path, cwd=self.root)
        state.started = state.plan.startup is None
        state.ready = False
        state.failures = 0

    def _run(self) -> None:
        """The supervisor; if it dies (a container that cannot even be started), the pod's `error` says why and
        its containers are stopped, since nothing would restart or probe them any more."""
        try:
            self._supervise()
        except BaseException as exc:  # noqa: BLE001 - the thread's end: reported through `error`, not lost
            log.exception("pod %s: supervisor failed", self.name)
            # RunContainerError: the kubelet's reason when the runtime cannot start a container's process.
            self.error = f"{type(exc).__name__}: {exc}"
            self.waiting_reason = "RunContainerError"
            self.ready = False
            with self._lock:
                process.stop_all([s.process for s in self.containers.values() if s.process is not None])
            self.on_change()

    def _supervise(self) -> None:
        for init in self.plan.init_containers:
            log_path = self.root / "logs" / f"{init.name}.log"
            proc = process.spawn(argv=init.argv, env=init.env, log_path=log_path, cwd=self.root)
            while proc.poll() is None:
                if self._stop.wait(0.2):
                    process.stop(proc, timeout=self._grace)
                    return
            if proc.returncode != 0:
                self.error = f"init container {init.name} exited with {proc.returncode}; see {log_path}"
                self.waiting_reason = "Init:Error"
                log.error("pod %s: %s", self.name, self.error)
                self.on_change()
                return
        with self._lock:
            if self._stop.is_set():  # stop_pods has stopped what ran under this lock; start nothing after it
                return
            for state in self.containers.values():
                self._spawn(state)
        while not self._stop.wait(PROBE_INTERVAL):
            changed = False
            with self._lock:
                if self._stop.is_set():
                    return
                for state in self.containers.values():
                    assert state.process is not None
                    if state.process.poll() is not None:  # restartPolicy: Always
                        log.warning(
                            "pod %s: container %s exited with %s; restarting",
                            self.name,
                            state.plan.name,
                            state.process.returncode,
                        )
                        process.stop(state.process, timeout=0)  # what it forked dies with it, as in a container
                        self._spawn(state)
                        state.restarts += 1  # after _spawn: a visible restart count implies the reset state
                        changed = True
            for state in self.containers.values():
                changed |= self._probe(state)
            ready = all(state.ready for state in self.containers.values())
            if ready != self.ready:
                self.ready = ready
                changed = True
            if changed:
                self.on_change()

    @staticmethod
    def _probe(state: ContainerState) -> bool:
        """Poll the container's startup and readiness probes; True if its readiness changed."""
        if not state.started:
            assert state.plan.startup is not None
            if not process.http_ok(state.plan.startup.url):
                return False
            state.started = True
        before = state.ready
        probe = state.plan.readiness
        if probe is None:
            state.ready = True
        elif process.http_ok(probe.url):
            state.ready, state.failures = True, 0
        else:
            state.failures += 1
            if not state.ready or state.failures >= probe.failure_threshold:
                state.ready = False
        return state.ready != before


def stop_pods(pods: Sequence[LocalPod], *, grace: float = GRACE) -> None:
    """Stop pods together: every container of every pod at once (SIGTERM after its preStop sleep, SIGKILL once
    `grace` s have passed), so stopping many pods takes one grace period, not one each, then their supervisors.

    The supervisors are told first but not waited for: one may be inside a probe of a server that accepts
    connections and does not answer yet (vLLM while it loads), which would hold the stop for the probe's timeout
    per container. Holding every pod's lock is enough: a supervisor restarts or starts containers only under its
    lock, and only while it has not been told to stop."""
    for pod in pods:
        pod._grace = grace
        pod._stop.set()
    with contextlib.ExitStack() as locked:
        for pod in pods:
            locked.enter_context(pod._lock)
        running = [
            (s.plan.pre_stop_sleep, s.process) for pod in pods for s in pod.containers.values() if s.process is not None
        ]
        _stop_containers(running, grace=grace)
    for pod in pods:
        if pod._thread.is_alive():
            pod._thread.join(timeout=60)


def _stop_containers(containers: Sequence[tuple[float, subprocess.Popen[bytes]]], *, grace: float) -> None:
    """Stop (preStop sleep, process) pairs together: each gets SIGTERM once its sleep has passed and SIGKILL once the
    rest of `grace` has, as a kubelet runs a container's preStop hook first and then sends SIGTERM, both within the
    pod's grace period. `grace` 0 kills them all at once, hooks unrun."""
    groups: dict[float, list[subprocess.Popen[bytes]]] = {}
    for sleep, proc in containers:
        groups.setdefault(min(sleep, grace) if grace > 0 else 0.0, []).append(proc)

    def stop_after(sleep: float, processes: list[subprocess.Popen[bytes]]) -> None:
        time.sleep(sleep)
        process.stop_all(processes, timeout=max(grace - sleep, MIN_GRACE_AFTER_PRE_STOP) if sleep else grace)

    if set(groups) <= {0.0}:
        process.stop_all(groups.get(0.0, []), timeout=grace)
        return
    with concurrent.futures.ThreadPoolExecutor(len(groups), thread_name_prefix="pre-stop") as pool:
        for done in [pool.submit(stop_after, sleep, processes) for sleep, processes in groups.items()]:
            done.result()
