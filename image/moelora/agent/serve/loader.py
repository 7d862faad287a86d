"""Putting an adapter's files into vLLM under its name: the output check, then the load (in place when vLLM serves
another version under the name), and the record's verdict: Loaded, failed, or an update refused while the version
vLLM had keeps serving. Runs on the agent's loop thread, like every other call to vLLM.
"""

from __future__ import annotations

import datetime
import logging
import secrets
from collections.abc import Callable
from typing import Protocol

from moelora.agent.errors import AdapterError, TransientError, redact
from moelora.agent.prepare import Preparer
from moelora.agent.reconcile import CANARY_PREFIX, Load, LoadedAdapter, Record, Serving, Stage
from moelora.agent.report.metrics import Metrics
from moelora.agent.serve import foreign
from moelora.agent.serve.vllm import Duplicate, VllmClient
from moelora.agent.store.cache import AdapterCache
from moelora.api import FailureReason

logger = logging.getLogger(__name__)


class Fail(Protocol):
    """Agent._fail: the record failed, counted and logged."""

    def __call__(self, record: Record, reason: FailureReason, message: str, *, permanent: bool) -> None: ...


class Loader:
    """The loop's calls that load and unload adapters, and what they do to the records."""

    def __init__(
        self,
        *,
        vllm: VllmClient,
        metrics: Metrics,
        cache: AdapterCache,
        preparer: Preparer,
        fail: Fail,
        monotonic: Callable[[], float],
        checked: Callable[[str, str], None] = lambda name, path: None,
        withdrawn: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.vllm, self.metrics, self.cache, self.preparer = vllm, metrics, cache, preparer
        self.fail, self.monotonic, self.checked, self.withdrawn = fail, monotonic, checked, withdrawn

    def load(self, record: Record, load: Load, *, current: LoadedAdapter | None, hand_over: bool = False) -> None:
        """Serve `record`'s files under its name (`current`: what vLLM serves under it now), or fail it.

        Files that pass the output check go to `checked` (the resolver's answer) before vLLM is asked to load them:
        a resolver already waiting for the name holds vLLM's lock on it, and gets its answer instead of blocking the
        load. With `hand_over`, the resolver is all there is: vLLM registers the files itself."""
        try:
            self.check_output(record, load.path)
        except AdapterError as error:
            self._refuse(record, load, error, current)
            return
        except TransientError as error:
            self.fail(record, error.reason, error.message, permanent=False)
            return
        self.checked(load.served_name, load.path)
        if hand_over:
            record.handed_at = self.monotonic()
            logger.info("handed adapter %s to vLLM's resolver as %r from %s", record.name, load.served_name, load.path)
            return
        inplace = load.inplace
        for _ in range(2):
            try:
                self.vllm.load(name=load.served_name, path=load.path, inplace=inplace)
            except Duplicate:
                inplace = True  # registered meanwhile (or by a previous agent): replace it
                continue
            except AdapterError as error:
                self.fail(record, error.reason, error.message, permanent=True)
                record.failed_version = record.version
                return
            except TransientError as error:
                self.fail(record, error.reason, error.message, permanent=False)
                return
            logger.info(
                "loaded adapter %s as %r from %s%s",
                record.name,
                load.served_name,
                load.path,
                " (in place)" if inplace else "",
            )
            self.mark_loaded(record, observe=True)
            return

    def check_output(self, record: Record, path: str) -> None:
        """Before the files are served under the adapter's name: vLLM loads them under a random name no client
        knows, computes one token of a one-token prompt, and unloads them. A non-finite logprob raises
        AdapterError(OutputNonFinite); files vLLM served under the name before are not checked again.

        One token of one prompt token is the most the check may compute: vLLM-CPU reuses a freed KV-cache block
        first, and its attention reads that block's stale slots (0 x NaN is NaN), so a poisoned completion changes
        the tokens of the requests after it; the one slot this check writes is overwritten by any later request
        before it is read. What the load itself leaves in vLLM's LoRA slots stays (README, "Security")."""
        if record.serving is not None and record.serving.path == path:
            return
        name = CANARY_PREFIX + secrets.token_hex(8)
        self.vllm.load(name=name, path=path)
        try:
            self.vllm.canary(name=name)
        finally:
            self.unload(name)  # one left behind (vLLM unreachable) goes in a later pass: plan() knows the prefix

    def _refuse(self, record: Record, load: Load, error: AdapterError, current: LoadedAdapter | None) -> None:
        """Files vLLM refused, or whose output is not finite: an update is refused while vLLM keeps serving the
        version it had under the name (UpdateRejected); anything else fails the adapter."""
        serving = record.serving
        if load.inplace and serving is not None and current is not None and current.path == serving.path:
            refusal = (str(record.version), error.reason, redact(error.message, self.preparer.secrets))
            logger.warning(
                "adapter %s: version %s refused, keeps serving %s: %s",
                record.name,
                record.version,
                serving.version,
                refusal[2],
            )
            self.metrics.failures.labels(record.name, FailureReason.UPDATE_REJECTED.value).inc()
            record.version, record.path, record.info = serving.version, serving.path, serving.info
            record.rejected, record.failed_version = refusal, None
            record.stage, record.loaded_at, record.started = Stage.LOADED, serving.loaded_at, None
            self.metrics.loaded.labels(record.name, record.served_name).set(1)
            return
        self.fail(record, error.reason, error.message, permanent=True)
        record.failed_version = record.version

    def mark_loaded(self, record: Record, *, observe: bool) -> None:
        # Adopting the files vLLM already served for it is no new load: its loadedAt stays.
        kept = not observe and record.serving is not None and record.serving.path == record.path
        record.stage = Stage.LOADED
        record.handed_at = None
        record.reason = record.message = None
        record.attempts = 0
        record.permanent = False
        if not kept or record.loaded_at is None:
            record.loaded_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        assert record.path is not None
        record.serving = Serving(version=record.version, path=record.path, info=record.info, loaded_at=record.loaded_at)
        if observe and record.started is not None:
            self.metrics.load_seconds.observe(self.monotonic() - record.started)
        record.started = None
        self.metrics.loaded.labels(record.name, record.served_name).set(1)
        if record.version:
            self.cache.touch(record.version)
            if record.path:
                self.preparer.remember(record.uid, version=record.version, path=record.path)

    def unload(self, served_name: str) -> bool:
        """True once vLLM no longer has the adapter because of this call. The name goes from the resolver's answers
        first (`withdrawn`), so that vLLM's resolver cannot load it back meanwhile."""
        self.withdrawn(served_name)
        try:
            unloaded = self.vllm.unload(name=served_name)
            logger.info("unloaded adapter %s", foreign.escape(served_name))
            return unloaded
        except TransientError as error:
            logger.warning("could not unload %s: %s", foreign.escape(served_name), error)
            return False
