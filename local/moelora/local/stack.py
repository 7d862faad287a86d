"""The whole stack on one machine, assembled from the other modules; shared by the embedded default, the
end-to-end tests and the benchmarks (one harness, not three).

`Stack.start()` brings up, in order: the Kubernetes API emulator (with a kubeconfig), moto's S3 with the generated
tiny model uploaded, the Secret with the S3 keys, the operator (in a thread, or as `python -m moelora.operator` in a
child process), and the local kubelet that runs whatever pods the operator renders. Then `kubectl` applies objects
like a user would, and `Stack.stop()` takes it all down in reverse order.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import yaml

from moelora.local import kubelet, manifests, models, process, s3
from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.apiserver.kubectl import find_kubectl
from moelora.local.operator_thread import OperatorThread

log = logging.getLogger("moelora.local.stack")
KUBECTL = find_kubectl()
# Clients reach the local pods directly, with no proxy to learn of a removal late: a deleted pod need not serve on.
LOCAL_DRAIN_DELAY_SECONDS = 0


class Stack:
    """The local stack. `root` holds everything it writes (model, kubeconfig, pod volumes and logs).

    `operator`: "thread" (kopf in this process; its log goes to root/operator.log), "process" (a child running
    `python -m moelora.operator`, so its memory can be measured on its own) or "none".
    `agent_env`: extra environment for the agent container only (tests shorten its poll interval).
    `s3_port`: where moto listens (0: a free port); `s3_keys`: the keys put in the `local-s3` Secret.
    `moe`: the model is the tiny Qwen3-MoE (moelora.local.moe) instead of the tiny Llama.
    `allowed_s3_endpoints`: S3 endpoints besides moto's that adapters may name (the operator's policy).
    """

    def __init__(
        self,
        *,
        root: pathlib.Path,
        namespace: str = "default",
        operator: str = "thread",
        agent_env: Mapping[str, str] | None = None,
        s3_keys: tuple[str, str] | None = None,
        s3_port: int = 0,
        moe: bool = False,
        allowed_s3_endpoints: Sequence[str] = (),
        progress: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.root = root
        self.namespace = namespace
        self.operator_mode = operator
        self.agent_env = dict(agent_env or {})
        self.s3_keys = s3_keys or ("AKIALOCALEXAMPLE", "local-secret-key-value")
        self.s3_port = s3_port
        self.moe = moe
        self.allowed_s3_endpoints = tuple(allowed_s3_endpoints)
        self.progress = progress
        self.api: KubeAPI | None = None
        self.s3: s3.S3Server | None = None
        self.kubelet: kubelet.LocalKubelet | None = None
        self.model_dir = root / "model"
        self._operator: Any = None
        self._operator_log: logging.Handler | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.progress("starting the Kubernetes API emulator")
            # The gateway's kinds as published, so a server may route through one (nothing routes requests here).
            published = ("InferencePool", "HTTPRoute")
            self.api = KubeAPI(kubeconfig=self.root / "kubeconfig", namespace=self.namespace, published=published)
            self.api.start()
            self.progress(f"  API server at {self.api.url}, kubeconfig {self.api.kubeconfig}")
            self.progress("starting S3 (moto) and uploading the generated tiny model")
            self.s3 = s3.start_moto(access_key_id=self.s3_keys[0], secret_access_key=self.s3_keys[1], port=self.s3_port)
            if not (self.model_dir / "model.safetensors").exists():
                self.progress(
                    f"  generating the tiny {'Qwen3-MoE' if self.moe else 'Llama'} (random weights, "
                    "BPE tokenizer trained offline)"
                )
                if self.moe:
                    from moelora.local import moe

                    moe.make_moe_model(path=self.model_dir)
                else:
                    models.make_model(path=self.model_dir)
            model_uri = manifests.MOE_MODEL_URI if self.moe else manifests.MODEL_URI
            s3.upload_dir(server=self.s3, source=self.model_dir, uri=model_uri)
            self.progress(f"  S3 at {self.s3.endpoint_url}, model at {model_uri}")
            self.apply(manifests.s3_secret(access_key_id=self.s3_keys[0], secret_access_key=self.s3_keys[1]))
            self._start_operator()
            self.kubelet = kubelet.LocalKubelet(
                api_url=self.api.url,
                namespace=self.namespace,
                root=self.root / "pods",
                extra_env={"agent": {"KUBECONFIG": str(self.api.kubeconfig), **self.agent_env}},
            )
            self.kubelet.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_operator(self) -> None:
        assert self.api is not None
        if self.operator_mode == "none":
            return
        self.progress(f"starting the operator ({self.operator_mode})")
        if self.operator_mode == "process":
            env = {
                **os.environ,
                "KUBECONFIG": str(self.api.kubeconfig),
                "MOELORA_ALLOWED_S3_ENDPOINTS": ",".join(self.allowed_s3_endpoints),
                "MOELORA_DRAIN_DELAY_SECONDS": str(LOCAL_DRAIN_DELAY_SECONDS),
            }
            self._operator = process.spawn(
                argv=[sys.executable, "-m", "moelora.operator"], env=env, log_path=self.root / "operator.log"
            )
            return
        from moelora.operator.settings import Settings

        handler = logging.FileHandler(self.root / "operator.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in ("kopf", "moelora.operator"):
            logging.getLogger(name).addHandler(handler)
        self._operator_log = handler
        # Cluster-wide: with a namespace list kopf also lists /api/v1/namespaces, a path kmock 0.8 cannot parse.
        settings = Settings(
            kubeconfig=str(self.api.kubeconfig),
            allowed_s3_endpoints=self.allowed_s3_endpoints,
            drain_delay_seconds=LOCAL_DRAIN_DELAY_SECONDS,
        )
        self._operator = OperatorThread(settings=settings)  # kept before it starts, so an interrupted start stops it
        self._operator.start()

    def stop(self, *, grace: float = kubelet.GRACE) -> None:
        """Take it all down in reverse order; every process it started gets SIGTERM, and SIGKILL after `grace` s."""
        self.progress("stopping")
        if self.kubelet is not None:
            self.kubelet.stop(grace=grace)
        if isinstance(self._operator, subprocess.Popen):
            process.stop(self._operator, timeout=grace)
        elif self._operator is not None:
            self._operator.stop()
        if self._operator_log is not None:
            for name in ("kopf", "moelora.operator"):
                logging.getLogger(name).removeHandler(self._operator_log)
            self._operator_log.close()
        if self.s3 is not None:
            self.s3.stop()
        if self.api is not None:
            self.api.stop()
        self.kubelet = self._operator = self.s3 = self.api = None

    @property
    def operator_pid(self) -> int | None:
        return self._operator.pid if isinstance(self._operator, subprocess.Popen) else None

    # -- acting like a user -----------------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the emulator (a fresh discovery and OpenAPI cache per stack)."""
        assert self.api is not None and KUBECTL is not None
        env = {**os.environ, "KUBECONFIG": str(self.api.kubeconfig), "KUBECACHEDIR": str(self.root / "kubecache")}
        result = subprocess.run(
            [KUBECTL, *args], input=input, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def apply(self, *objects: Mapping[str, Any] | str) -> None:
        """`kubectl apply -f -` of objects (dicts) or YAML text."""
        text = "\n---\n".join(o if isinstance(o, str) else yaml.safe_dump(dict(o)) for o in objects)
        self.kubectl("apply", "-n", self.namespace, "-f", "-", input=text)

    def delete(self, kind: str, name: str) -> None:
        self.kubectl("delete", "-n", self.namespace, kind, name, "--wait=false")

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object as kubectl sees it, or None if it does not exist."""
        result = self.kubectl("get", "-n", self.namespace, kind, name, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise RuntimeError(f"kubectl get {kind} {name}: {result.stderr.strip()}")
        return dict(json.loads(result.stdout))

    def read(self, path: str) -> Any:
        """GET an API path straight from the emulator (faster than kubectl when polling)."""
        assert self.api is not None
        return Rest(url=self.api.url).request(method="GET", path=path)

    def adapter(self, name: str) -> dict[str, Any] | None:
        from moelora.api import GROUP, VERSION

        return self.read(f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/loraadapters/{name}")

    def model_server(self, name: str) -> dict[str, Any] | None:
        from moelora.api import GROUP, VERSION

        return self.read(f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/modelservers/{name}")

    def upload_adapter(self, *, source: pathlib.Path, name: str) -> str:
        """Upload an adapter directory under its name in the adapters bucket; return its s3:// URI."""
        assert self.s3 is not None
        uri = manifests.adapter_uri(name)
        s3.upload_dir(server=self.s3, source=source, uri=uri)
        return uri

    # -- waiting ----------------------------------------------------------------------------------------------------
    def wait_pods(self, server: str, *, replicas: int, timeout: float = 300.0) -> list[kubelet.LocalPod]:
        """Wait until the server's Deployment exists and `replicas` of its pods are ready."""
        assert self.kubelet is not None
        return self.kubelet.wait_ready(server, replicas=replicas, timeout=timeout)

    def wait_adapter(
        self, name: str, *, phase: str, timeout: float = 120.0, replicas: int | None = None
    ) -> dict[str, Any]:
        """Wait until the adapter's status.phase is `phase` (and, if given, `replicas` pods report that state
        themselves: the roll-up turns Failed at the first pod's refusal, while another may still be downloading)."""
        deadline = time.monotonic() + timeout
        body: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            body = self.adapter(name)
            status = (body or {}).get("status") or {}
            pods = (status.get("replicas") or {}).values()
            if status.get("phase") == phase and (
                replicas is None or sum(pod.get("state") == phase for pod in pods) >= replicas
            ):
                return body  # type: ignore[return-value]
            time.sleep(0.2)
        raise TimeoutError(f"LoRAAdapter {name} not {phase} after {timeout:.0f} s: {json.dumps(body)[:2000]}")

    def remove_server(self, name: str, *, timeout: float = 120.0) -> None:
        """Delete a ModelServer and the LoRAAdapters that name it, and wait until its pods are gone (the emulator's
        garbage collector takes its workload, the kubelet then stops the pods)."""
        from moelora.api import GROUP, VERSION

        running = self.kubelet
        assert running is not None
        listed = self.read(f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/loraadapters") or {}
        for item in listed.get("items") or []:
            if (item.get("spec") or {}).get("modelServer") == name:
                self.delete("loraadapter", item["metadata"]["name"])
        self.delete("modelserver", name)
        process.wait_for(lambda: not running.pods_of(name), timeout=timeout, what=f"{name}'s pods gone")

    def vllm_urls(self, server: str) -> list[str]:
        """The local base URL of vLLM in each pod of the server (port 8000 in the pod)."""
        assert self.kubelet is not None
        from moelora.operator.render.engine import VLLM_PORT

        return [pod.url(VLLM_PORT) for pod in self.kubelet.pods_of(server)]
