"""The emulator served over HTTP on 127.0.0.1 from a thread of its own, with a kubeconfig and kubectl for it."""

from __future__ import annotations

import asyncio
import copy
import pathlib
import shutil
import subprocess
import tempfile
import threading
from typing import Any, Self

import aiohttp.test_utils
import kmock

from moelora.local.apiserver.emulator import Emulator
from moelora.local.apiserver.kubectl import clean_env, kubectl_binary, write_kubeconfig


class KubeAPI:
    """The emulated API server on 127.0.0.1 (a free port unless given), in a thread with its own event loop.

    Use as a context manager, or `start()`/`stop()`. `url`, `kubeconfig` (a file it writes), `emulator` (which a
    test may replace with a subclass before starting). `published` names other projects' kinds whose published CRDs
    the cluster has installed (`Emulator.serve_published`).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        kubeconfig: pathlib.Path | None = None,
        validate: bool = True,
        namespace: str = "default",
        published: tuple[str, ...] = (),
    ) -> None:
        self._port = port
        self._kubeconfig_path = kubeconfig
        self._namespace = namespace
        self.emulator = Emulator(validate=validate)
        self.emulator.serve_published(*published)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="kube-api", daemon=True)
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.url = ""
        self._workdir: pathlib.Path | None = None
        self.kubeconfig = pathlib.Path()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> Self:
        self._thread.start()
        self._started.wait(timeout=30)
        if self._error is not None:
            raise RuntimeError("the Kubernetes API emulator did not start") from self._error
        self._workdir = pathlib.Path(tempfile.mkdtemp(prefix="moelora-kube-"))
        path = self._kubeconfig_path or self._workdir / "kubeconfig"
        self.kubeconfig = write_kubeconfig(path, server=self.url, namespace=self._namespace)
        return self

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this server, with a cache directory of this server's own."""
        assert self._workdir is not None, "start() first"
        env = {**clean_env(), "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self._workdir / "cache")}
        command = [kubectl_binary(), *args]
        result = subprocess.run(
            command, input=stdin, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def stop(self) -> None:
        if self._stopping is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=30)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._started.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        async with self.emulator:
            server = aiohttp.test_utils.RawTestServer(self.emulator, host="127.0.0.1", port=self._port or None)
            await server.start_server()
            try:
                self.url = str(server.make_url("")).rstrip("/")
                self._started.set()
                await self._stopping.wait()
            finally:
                await server.close()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` in the server's loop (the emulator's state is not thread-safe) and return its result."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A stored object (a deep copy) or None; `resource` like 'apps/v1/deployments' or 'v1/services'."""

        def read() -> dict[str, Any] | None:
            key = (kmock.resource(resource), namespace, name)
            if key not in self.emulator.objects or self.emulator.objects[key].deleted:
                return None
            return copy.deepcopy(self.emulator.objects[key].raw)

        return self.call(read)

    def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored objects of a resource (deep copies), in one namespace or all."""

        def read() -> list[dict[str, Any]]:
            wanted = kmock.resource(resource)
            return [
                copy.deepcopy(obj.raw)
                for (res, ns, _), obj in self.emulator.objects.items()
                if res == wanted and not obj.deleted and (namespace is None or ns == namespace)
            ]

        return self.call(read)
