"""The operator's shared state, passed to every handler as kopf's memo: settings, the API client, the executor."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import datetime
import functools
import pathlib
from collections.abc import Callable
from importlib.resources.abc import Traversable
from typing import ParamSpec, TypeVar

import kubernetes.client
import kubernetes.config

from moelora.operator.control.metrics import Metrics
from moelora.operator.control.workqueue import KeyedQueue
from moelora.operator.decide.expectations import Expectations, ServerKey
from moelora.operator.kube.events import Recorder
from moelora.operator.render import kernel_configs
from moelora.operator.settings import Settings

_P = ParamSpec("_P")
_T = TypeVar("_T")


def wall_clock() -> datetime.datetime:
    """The wall clock to the second, as conditions store their transition times."""
    return datetime.datetime.now(tz=datetime.UTC).replace(microsecond=0)


# Threads doing blocking API work for the handlers, and as many pooled connections (the client's default pool is
# 5 per CPU, so on a small node threads beyond it opened and dropped a connection per request).
API_THREADS = 16


def kube_configuration(settings: Settings) -> kubernetes.client.Configuration:
    """The API client configuration: in-cluster service account, else the kubeconfig. Touches no global state."""
    configuration = kubernetes.client.Configuration()
    configuration.connection_pool_maxsize = API_THREADS
    if settings.kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            return configuration
        except kubernetes.config.ConfigException:
            pass
    kubernetes.config.load_kube_config(config_file=settings.kubeconfig, client_configuration=configuration)
    return configuration


@dataclasses.dataclass(frozen=True, kw_only=True)
class Context:
    """kopf copies the memo per object shallowly, so the mutable fields below are shared by every handler."""

    settings: Settings
    kernel_bundle: Traversable | None  # moelora.kernels' configs/ folder (or settings.kernel_configs_dir)
    api: kubernetes.client.ApiClient
    # The kubernetes client blocks: handlers are async (indexes are read in the loop) and do API work here.
    executor: concurrent.futures.ThreadPoolExecutor
    # Every event about a server becomes its key here; one pass per key at a time (controller.py).
    queue: KeyedQueue[ServerKey] = dataclasses.field(default_factory=lambda: KeyedQueue(concurrency=API_THREADS))
    # The operator's own writes, so a pass tells news from their echoes (decide/expectations.py).
    expectations: Expectations = dataclasses.field(default_factory=Expectations)

    # LoRAAdapter Events, identical ones folded into one (kube/events.py).
    events: Recorder = dataclasses.field(default_factory=Recorder)
    # The operator's Prometheus metrics (metrics.py), served on settings.metrics_port.
    metrics: Metrics = dataclasses.field(default_factory=Metrics)

    # Operator-level tasks (resync.py, metrics.py), cancelled at kopf's cleanup.
    background: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    @classmethod
    def open(cls, settings: Settings) -> Context:
        """A context with its own API client and executor; close() releases them."""
        bundle = (
            pathlib.Path(settings.kernel_configs_dir) if settings.kernel_configs_dir else kernel_configs.bundle_root()
        )
        return cls(
            settings=settings,
            kernel_bundle=bundle,
            api=kubernetes.client.ApiClient(kube_configuration(settings)),
            executor=concurrent.futures.ThreadPoolExecutor(max_workers=API_THREADS, thread_name_prefix="moelora-api"),
        )

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.api.close()

    async def call(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run blocking API work in the executor, with the context kopf.event() needs."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, functools.partial(context.run, fn, *args, **kwargs)
        )
