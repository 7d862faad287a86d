"""vLLM's LoRA resolver for moelora pods: a name vLLM does not serve is asked of the pod's adapter agent.

vLLM (with VLLM_ALLOW_RUNTIME_LORA_UPDATING, which the operator sets) calls every registered `LoRAResolver` for a
request's `model` that is neither the base model nor a registered adapter, holding a per-name lock, and registers
the `LoRARequest` it gets (`OpenAIServingModels.resolve_lora`, the same in 0.26 and 0.32). This resolver asks the
agent (moelora.agent.serve.ondemand) over loopback, at the address the agent writes beside the admin guard's key
and with that key: the agent answers with the path of files that passed every check the agent applies to any adapter, or
refuses. A name that is no LoRAAdapter of this pod's ModelServer gets None, so vLLM answers its own 404; a refusal
is raised as an HTTPException, which vLLM's exception handler turns into that status with the reason as message
(422 for an adapter refused for good, 503 for one not servable now). No agent address (a vLLM started without the
agent): None, as if no resolver were registered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import urllib.error
import urllib.request

from vllm.lora.request import LoRARequest
from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

from .admin_guard import DEFAULT_KEY_FILE, HEADER, KEY_FILE_ENV

__all__ = ["ADDRESS_FILE", "NAME", "AgentResolver", "Refused", "ask_agent", "register_resolver"]

log = logging.getLogger("vllm.moelora_plugin")

NAME = "moelora"
ADDRESS_FILE = "resolver"  # moelora.agent.serve.ondemand.ADDRESS_FILE
# The agent bounds its own wait (MOELORA_RESOLVE_SECONDS); this only ends a call to an agent that hangs.
TIMEOUT = 3600.0


class Refused(Exception):
    """The agent refused the name (`status`, with its message), or could not be asked."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def ask_agent(name: str, *, key_file: pathlib.Path, timeout: float = TIMEOUT) -> str | None:
    """The path the agent hands over for `name`; None when the name is no adapter of this server or there is no
    agent address; raises Refused otherwise."""
    try:
        address = (key_file.parent / ADDRESS_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    try:
        key = key_file.read_text().strip()
    except OSError as error:
        raise Refused(503, f"the adapter agent's key cannot be read: {error}") from None
    request = urllib.request.Request(
        address + "/resolve",
        data=json.dumps({"name": name}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", HEADER: key},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return str(json.loads(response.read())["path"])
    except urllib.error.HTTPError as error:
        status, payload = error.code, error.read()
    except (OSError, ValueError, KeyError) as error:
        raise Refused(503, f"the adapter agent of this pod did not answer: {error}") from None
    if status == 404:
        return None
    try:
        message = str(json.loads(payload)["message"])
    except (ValueError, KeyError, TypeError):
        message = payload[:500].decode(errors="replace")
    raise Refused(status if 400 <= status < 600 else 503, message)


class AgentResolver(LoRAResolver):
    def __init__(self, key_file: pathlib.Path) -> None:
        self.key_file = key_file

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        try:
            # The agent may download and check for minutes: off the event loop, which keeps serving meanwhile.
            path = await asyncio.to_thread(ask_agent, lora_name, key_file=self.key_file)
        except Refused as refused:
            from fastapi import HTTPException  # the API server's; vLLM's handler answers with its status and detail

            raise HTTPException(status_code=refused.status, detail=refused.message) from None
        if path is None:
            return None
        # vLLM replaces the id with its own counter's before it registers the request; 1 passes the check meanwhile.
        return LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=path)


def register_resolver() -> None:
    """Register the resolver (in every vLLM process; only the API server's asks it)."""
    key_file = pathlib.Path(os.environ.get(KEY_FILE_ENV) or DEFAULT_KEY_FILE)
    if NAME not in LoRAResolverRegistry.get_supported_resolvers():
        LoRAResolverRegistry.register_resolver(NAME, AgentResolver(key_file))
