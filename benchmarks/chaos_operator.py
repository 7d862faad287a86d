"""Crash chaos for the operator (issue 17): SIGKILLs of `python -m moelora.operator` at random moments while 50
LoRAAdapters and 2 ModelServers are created, changed and deleted, then a last restart and the checks.

    .venv/bin/python benchmarks/chaos_operator.py [--kills 100] [--seed 17] [--min-up 0.2] [--max-up 3.0]

The emulated API server (moelora.local.apiserver) runs in this process over HTTP on loopback and outlives every
kill; the operator is its own process, started again after each kill. Around it (chaos_cluster.World) the cluster's
other actors: ready pods for each Deployment, agents reporting each adapter Loaded (Failed when its source lies
under bad/), the garbage collector. A driver thread changes the objects meanwhile, also while the operator is down.
Each kill comes 0.2-3 s (uniform) after the operator answered its liveness probe. After the last kill the driver
makes 10 more changes and stops, and the operator starts once more; then, checked 10 times a second
(chaos_cluster.violations): each server owns exactly the children its spec asks for and no more, nothing the
operator labels lacks an owner, every count and phase is right, no object is held by a finalizer; and it must stay
so until `settle_s` after that restart.
Prints a Markdown table; tests/chaos/test_operator_kills.py asserts the same, at full size and reduced.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import pathlib
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from chaos_cluster import CRS, NS, Snapshot, World, snapshot, violations

from moelora.local import process
from moelora.local.apiserver import KubeAPI, Rest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERVERS = ("s0", "s1")
ADAPTERS = tuple(f"a{i:02d}" for i in range(50))
SECRETS = ("creds-a", "creds-b")


@dataclasses.dataclass
class Report:
    kills: int
    seed: int
    operations: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    ready_s: list[float] = dataclasses.field(default_factory=list)  # each start (the final one too) to liveness OK
    consistent_s: float | None = None  # the final start until the first consistent snapshot
    violations_at_restart: int = 0  # what the final start has to put right
    violations: list[str] = dataclasses.field(default_factory=list)  # at the end, or after consistency was reached
    world: dict[str, int] = dataclasses.field(default_factory=dict)
    finalizers_seen: int = 0  # objects that carried a finalizer at any check
    operator_errors: int = 0  # ERROR lines in the operator's logs, over every run
    warnings: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # Events' reasons
    duration_s: float = 0.0
    trace: list[str] = dataclasses.field(default_factory=list)  # the final checks: seconds, violations, the first
    log: str = ""


def adapter_body(name: str, rng: random.Random) -> dict[str, Any]:
    source: dict[str, Any] = {"uri": f"s3://chaos-bucket/{rng.choice(('good', 'good', 'bad'))}/{name}/"}
    if rng.random() < 0.2:
        source["credentialsSecret"] = {"name": rng.choice(SECRETS)}
    spec = {"modelServer": rng.choice(SERVERS), "source": source}
    return {"apiVersion": "moelora.io/v1alpha1", "kind": "LoRAAdapter", "metadata": {"name": name}, "spec": spec}


def server_body(name: str, rng: random.Random) -> dict[str, Any]:
    spec = {
        "model": {"name": "org/tiny-moe"},
        "replicas": rng.choice((1, 2)),
        "engineArgs": [f"--max-model-len={rng.choice((2048, 4096, 8192))}"],
    }
    return {"apiVersion": "moelora.io/v1alpha1", "kind": "ModelServer", "metadata": {"name": name}, "spec": spec}


class Driver(threading.Thread):
    """Creates, changes and deletes adapters and servers at random, one every 0.05-0.3 s, until stop()."""

    def __init__(self, *, kube: KubeAPI, rng: random.Random, operations: collections.Counter[str]) -> None:
        super().__init__(name="chaos-driver", daemon=True)
        self.kube, self.rng, self.operations = kube, rng, operations
        self.rest = Rest(url=kube.url)
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        if self.error is not None:
            raise RuntimeError("the chaos driver failed") from self.error

    def run(self) -> None:
        try:
            while not self._halt.wait(self.rng.uniform(0.05, 0.3)):
                self.step(snapshot(self.kube))
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def step(self, snap: Snapshot) -> None:
        rng = self.rng
        adapters = {item.name for item in snap.of("LoRAAdapter")}
        servers = {item.name for item in snap.of("ModelServer")}
        choices = [("update adapter", 4), ("delete adapter", 2), ("update server", 2), ("delete server", 0.4)]
        if set(ADAPTERS) - adapters:
            choices.append(("create adapter", 4))
        if set(SERVERS) - servers:
            choices.append(("create server", 2))
        what = rng.choices([c for c, _ in choices], weights=[w for _, w in choices])[0]
        verb, kind = what.split()
        plural = "loraadapters" if kind == "adapter" else "modelservers"
        present = sorted(adapters if kind == "adapter" else servers)
        if verb == "create":
            name = rng.choice(sorted(set(ADAPTERS if kind == "adapter" else SERVERS) - set(present)))
            body = adapter_body(name, rng) if kind == "adapter" else server_body(name, rng)
            done = self._send("POST", f"{CRS}/{plural}", body)
        elif not present:
            return
        elif verb == "delete":
            done = self._send("DELETE", f"{CRS}/{plural}/{rng.choice(present)}")
        else:
            name = rng.choice(present)
            body = adapter_body(name, rng) if kind == "adapter" else server_body(name, rng)
            if kind == "adapter":  # a merge patch keeps what it does not name: drop a Secret explicitly
                body["spec"]["source"].setdefault("credentialsSecret", None)
            done = self._send("PATCH", f"{CRS}/{plural}/{name}", {"spec": body["spec"]})
        self.operations[what if done else "refused"] += 1

    def _send(self, method: str, path: str, body: Any = None) -> bool:
        """True if the API server took it (False: a 404 or 409 from a race with the garbage collector)."""
        try:
            return self.rest.request(method=method, path=path, body=body) is not None
        except RuntimeError as exc:
            if "HTTP 409" in str(exc):
                return False
            raise


class Operator:
    """`python -m moelora.operator` against the emulator, started again and again; its output appended to `log`."""

    def __init__(self, *, kubeconfig: pathlib.Path, log: pathlib.Path) -> None:
        self.kubeconfig, self.log = kubeconfig, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it; seconds until its liveness endpoint answered (kopf's startup activities done)."""
        port = process.free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            # This checkout's code, whatever the environment installed.
            "PYTHONPATH": os.pathsep.join(str(ROOT / part) for part in ("operator", "image", "kernels", "local")),
            "MOELORA_LIVENESS_ENDPOINT": f"http://127.0.0.1:{port}/healthz",
        }
        start = time.monotonic()
        argv = [sys.executable, "-m", "moelora.operator"]
        self.process = process.spawn(argv=argv, env=env, log_path=self.log)
        process.wait_http_ok(
            f"http://127.0.0.1:{port}/healthz", timeout=60, process=self.process, log_path=self.log, interval=0.02
        )
        return time.monotonic() - start

    def kill(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        with open(self.log, "a") as log:
            log.write("---- SIGKILL ----\n")

    def stop(self) -> None:
        if self.process is not None:
            process.stop(self.process)


def populate(kube: KubeAPI, rng: random.Random) -> None:
    rest = Rest(url=kube.url)
    for name in SERVERS:
        rest.request(method="POST", path=f"{CRS}/modelservers", body=server_body(name, rng))
    for name in ADAPTERS:
        rest.request(method="POST", path=f"{CRS}/loraadapters", body=adapter_body(name, rng))


def run(
    *,
    kills: int = 100,
    seed: int = 17,
    up_s: tuple[float, float] = (0.2, 3.0),
    settle_s: float = 30.0,
    final_changes: int = 10,
    log_dir: pathlib.Path | None = None,
) -> Report:
    """The chaos run; `settle_s` after the final start the checks end (the state must hold until then)."""
    report = Report(kills=kills, seed=seed)
    rng = random.Random(seed)
    log_dir = log_dir or pathlib.Path(tempfile.mkdtemp(prefix="chaos-operator-"))
    began = time.monotonic()
    with KubeAPI(namespace=NS) as kube:
        populate(kube, rng)
        world = World(kube=kube)
        driver = Driver(kube=kube, rng=random.Random(rng.random()), operations=report.operations)
        operator = Operator(kubeconfig=kube.kubeconfig, log=log_dir / "operator.log")
        world.start()
        driver.start()
        try:
            for _ in range(kills):
                report.ready_s.append(operator.start())
                time.sleep(rng.uniform(*up_s))
                operator.kill()
            driver.stop()
            # Changes the operator has not seen, so the final start has work to do; after them only the operator
            # (and the cluster around it) changes anything.
            for _ in range(final_changes):
                driver.step(snapshot(kube))
            time.sleep(1.0)  # the cluster's actors answer them (agents report new adapters) meanwhile
            report.violations_at_restart = len(violations(snapshot(kube)))
            start = time.monotonic()
            report.ready_s.append(operator.start())
            _settle(kube, report, start=start, settle_s=settle_s, operator=operator)
        finally:
            operator.stop()
            world.stop()
            driver.stop()
        report.world = dict(world.done)
        events = kube.list("v1/events", NS)
        report.warnings.update(event.get("reason", "") for event in events if event.get("type") == "Warning")
    text = (log_dir / "operator.log").read_text(errors="replace")
    report.operator_errors = sum(" ERROR " in line for line in text.splitlines())
    report.log = str(log_dir / "operator.log")
    report.duration_s = time.monotonic() - began
    return report


def _settle(kube: KubeAPI, report: Report, *, start: float, settle_s: float, operator: Operator) -> None:
    """Check until `settle_s` after `start`: when the state first became consistent, and what broke after."""
    seen: set[tuple[str, str]] = set()
    found: list[str] = []
    while time.monotonic() - start < settle_s:
        snap = snapshot(kube)
        seen |= {(item.kind, item.name) for item in snap.items if item.meta.get("finalizers")}
        found = violations(snap)
        report.trace.append(f"{time.monotonic() - start:5.2f} s {len(found):3d} {found[0] if found else ''}")
        if operator.process is not None and operator.process.poll() is not None:
            found.append(f"the operator exited with {operator.process.returncode}")
        if not found and report.consistent_s is None:
            report.consistent_s = time.monotonic() - start
        elif found and report.consistent_s is not None:
            break  # consistent once, then not: a regression
        time.sleep(0.1)
    report.violations = found
    report.finalizers_seen = len(seen)


def table(report: Report) -> str:
    ops = report.operations
    changes = sum(count for what, count in ops.items() if what != "refused")
    by_kind = ", ".join(f"{what} {ops[what]}" for what in sorted(ops) if what != "refused")
    consistent = f"{report.consistent_s:.1f} s" if report.consistent_s is not None else "never"
    ready = report.ready_s
    rows = [
        ("SIGKILLs of the operator", str(report.kills)),
        ("changes applied (refused: 404/409 races)", f"{changes} ({ops['refused']}): {by_kind}"),
        ("restart to liveness OK, median / max", f"{statistics.median(ready):.2f} s / {max(ready):.2f} s"),
        ("violations when the operator starts the last time", str(report.violations_at_restart)),
        ("final restart to consistent state", consistent),
        ("violations (at the end, or after consistency)", str(len(report.violations))),
        ("objects that ever carried a finalizer (final checks)", str(report.finalizers_seen)),
        ("late children removed by the garbage collector's sweep", str(report.world.get("collected", 0))),
        (
            "agent reports / pods made by the cluster's other actors",
            f"{report.world.get('reports', 0)} / {report.world.get('pods', 0)}",
        ),  # fmt: skip
        ("ERROR lines in the operator's logs", str(report.operator_errors)),
        ("Warning Events, by reason", ", ".join(f"{r} {n}" for r, n in report.warnings.most_common()) or "none"),
        ("run time", f"{report.duration_s:.0f} s"),
    ]
    lines = ["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    lines += [f"- {violation}" for violation in report.violations[:20]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--min-up", type=float, default=0.2, help="seconds up after liveness OK, at least")
    parser.add_argument("--max-up", type=float, default=3.0)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after the final start the checks run")
    parser.add_argument("--trace", action="store_true", help="print every final check's count and first violation")
    args = parser.parse_args()
    report = run(kills=args.kills, seed=args.seed, up_s=(args.min_up, args.max_up), settle_s=args.settle)
    print(f"{platform.node()} {os.cpu_count()} cores, python {platform.python_version()}, seed {args.seed}")
    print(table(report))
    print(f"operator log: {report.log}")
    if args.trace:
        print("\n".join(report.trace))
    return 0 if not report.violations and report.consistent_s is not None and report.consistent_s <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
