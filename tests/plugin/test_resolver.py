"""moelora's LoRA resolver (moelora.vllm_plugin.resolver) between vLLM 0.32's own resolution code and the agent's
listener (moelora.agent.serve.ondemand.ResolveServer), in-process: vLLM's `OpenAIServingModels.resolve_lora` registers
the path the agent hands over, gets vLLM's own 404 for a name that is no adapter of the server, and a refusal becomes
vLLM's error response with the agent's status and reason; the lock vLLM holds on the name is released either way.
"""

from __future__ import annotations

import asyncio
import collections
import pathlib
import types
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import HTTPException
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.handlers.http import http_exception_handler
from vllm.lora.request import LoRARequest
from vllm.lora.resolver import LoRAResolverRegistry
from vllm.utils.counter import AtomicCounter

import moelora.vllm_plugin as plugin
from moelora.agent.serve.ondemand import ADDRESS_FILE, Answer, Resolutions, ResolveServer
from moelora.vllm_plugin import resolver

REFUSED = Answer(422, reason="RankTooHigh", message="LoRA adapter 'bad' cannot be served here: RankTooHigh: r=64")
GONE = Answer(404, reason="NotFound", message="no LoRAAdapter of ModelServer srv serves 'gone'")


@pytest.fixture
def agent(tmp_path: pathlib.Path) -> Iterator[tuple[pathlib.Path, ResolveServer]]:
    """The agent's listener, its address beside the key; the loop answers at once: 'a' servable, 'bad' refused."""
    key_file = tmp_path / "admin" / "key"
    key_file.parent.mkdir()
    key_file.write_text("the-pods-key\n")
    answers = {"bad": REFUSED, "gone": GONE}
    desk = Resolutions(wake=lambda: [desk.refuse(name, answers[name]) for name in desk.asked()])
    desk.serve("a", "/cache/abc/served")
    server = ResolveServer(resolutions=desk, key="the-pods-key", timeout=5, address_file=key_file.parent / ADDRESS_FILE)
    server.start()
    yield key_file, server
    server.stop()


def test_the_agent_is_asked_with_the_pods_key(agent: tuple[pathlib.Path, ResolveServer]) -> None:
    key_file, server = agent
    assert resolver.ask_agent("a", key_file=key_file) == "/cache/abc/served"
    assert resolver.ask_agent("gone", key_file=key_file) is None
    with pytest.raises(resolver.Refused) as refused:
        resolver.ask_agent("bad", key_file=key_file)
    assert (refused.value.status, refused.value.message) == (422, REFUSED.message)
    key_file.write_text("another-key")  # not the agent's: its listener refuses before reading the name
    with pytest.raises(resolver.Refused) as forbidden:
        resolver.ask_agent("a", key_file=key_file)
    assert forbidden.value.status == 403


def test_without_an_agent_address_vllm_answers_as_without_a_resolver(tmp_path: pathlib.Path) -> None:
    (tmp_path / "key").write_text("k")
    assert resolver.ask_agent("a", key_file=tmp_path / "key") is None


def test_an_agent_that_does_not_answer_is_a_503(agent: tuple[pathlib.Path, ResolveServer]) -> None:
    key_file, server = agent
    server.server.shutdown()  # the listener gone, its address left behind: as after a SIGKILL of the agent
    server.server.server_close()
    with pytest.raises(resolver.Refused) as refused:
        resolver.ask_agent("a", key_file=key_file)
    assert refused.value.status == 503 and "did not answer" in refused.value.message


class Engine:
    def __init__(self) -> None:
        self.added: list[LoRARequest] = []

    async def add_lora(self, request: LoRARequest) -> None:
        self.added.append(request)


def models_with(resolvers: list[Any]) -> OpenAIServingModels:
    """vLLM's serving models object with only what resolve_lora reads (an engine is no unit test's to start)."""
    models = object.__new__(OpenAIServingModels)
    models.lora_requests = {}
    models.lora_resolvers = resolvers
    models.lora_resolver_lock = collections.defaultdict(asyncio.Lock)
    models.lora_id_counter = AtomicCounter(0)
    models.model_config = types.SimpleNamespace(model="base")
    models.engine_client = Engine()
    return models


def test_vllm_registers_what_the_agent_hands_over_and_answers_its_refusals(
    agent: tuple[pathlib.Path, ResolveServer],
) -> None:
    key_file, _ = agent
    models = models_with([resolver.AgentResolver(key_file)])

    async def scenario() -> None:
        request = await models.resolve_lora("a")
        assert isinstance(request, LoRARequest) and request.lora_path == "/cache/abc/served"
        assert models.lora_requests["a"] is request and models.engine_client.added == [request]
        assert await models.resolve_lora("a") is request  # registered: the resolver is not asked again
        missing = await models.resolve_lora("gone")
        assert isinstance(missing, ErrorResponse) and missing.error.code == 404
        with pytest.raises(HTTPException) as refused:
            await models.resolve_lora("bad")
        assert (refused.value.status_code, refused.value.detail) == (422, REFUSED.message)
        assert not models.lora_resolver_lock["bad"].locked()  # the name is free for the next request
        request = types.SimpleNamespace(app=types.SimpleNamespace(state=types.SimpleNamespace(args=None)))
        request.app.state.args = types.SimpleNamespace(log_error_stack=False)
        response = await http_exception_handler(request, refused.value)  # what vLLM's app answers with it
        assert response.status_code == 422 and b"RankTooHigh: r=64" in response.body

    asyncio.run(scenario())


def test_the_plugin_registers_the_resolver_without_a_kernel_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugin.ENV, raising=False)
    monkeypatch.delitem(LoRAResolverRegistry.resolvers, resolver.NAME, raising=False)
    plugin.register()
    plugin.register()  # vLLM may load plugins more than once per process
    assert isinstance(LoRAResolverRegistry.get_resolver(resolver.NAME), resolver.AgentResolver)
