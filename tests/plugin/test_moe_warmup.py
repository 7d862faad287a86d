"""The MoE hooks' warm-up compiles every kernel variant that serving launches afterwards, at any token count.

A Triton kernel compiles once per variant: its constexprs, launch options, and what Triton specialises each other
argument on (dtype, a pointer's 16-byte alignment, an integer equal to 1 or divisible by 16, unless listed in
do_not_specialize). The launches are recorded here, not run, with that key computed by Triton's own
`native_specialize_impl` (the function its launcher's binder calls), so the check needs no GPU and no compiler.
"""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace

import pytest
import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

from moelora.kernels import expand, launch_config, onepass, routing, shrink
from moelora.vllm_plugin import moe_hooks

EXPERTS, LORAS, TOP_K, HIDDEN, INTER, RANK = 4, 3, 2, 32, 16, 8
TABLE_MS = (1, 16, 64)  # the test's config table buckets


class Recorder:
    """Stands in for one @triton.jit kernel: each launch adds its compile key to `keys[phase]`, nothing runs."""

    def __init__(self, name: str, kernel: object, keys: dict[str, set], phase: list[str]) -> None:
        self.name, self.keys, self.phase = name, keys, phase
        self.params = list(inspect.signature(kernel.fn).parameters.values())
        self.fixed = set(kernel.kwargs.get("do_not_specialize") or ())

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            bound = dict(zip((p.name for p in self.params), args)) | kwargs
            key = []
            for p in self.params:
                value = bound.get(p.name, p.default)
                if "constexpr" in str(p.annotation):
                    key.append((p.name, value))
                else:
                    key.append(
                        (p.name, native_specialize_impl(BaseBackend, value, False, p.name not in self.fixed, True))
                    )
            options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in {p.name for p in self.params}))
            self.keys[self.phase[0]].add((self.name, tuple(key), options))

        return launch


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Kernel launches recorded by phase ("warm": inside the warm-up, "serve": elsewhere), warm-ups on (as on CUDA),
    and a config table of this test's shapes read as the bundled one would be."""
    keys: dict[str, set] = {"warm": set(), "serve": set()}
    phase = ["serve"]
    for module, name in (
        (shrink, "_shrink_kernel"),
        (expand, "_expand_kernel"),
        (onepass, "_onepass_kernel"),
        (routing, "_route_tiny_kernel"),
        (routing, "_route_count_kernel"),
        (routing, "_route_finish_kernel"),
    ):
        monkeypatch.setattr(module, name, Recorder(name, getattr(module, name), keys, phase))
    warm = moe_hooks._warm_up

    def warm_up(*args, **kwargs):
        phase[0] = "warm"
        try:
            warm(*args, **kwargs)
        finally:
            phase[0] = "serve"

    monkeypatch.setattr(moe_hooks, "_warm_up", warm_up)
    monkeypatch.setattr(moe_hooks, "_compiles_on", lambda device: True)
    monkeypatch.setattr(moe_hooks, "_warmed", set())
    monkeypatch.setenv("MOELORA_WARMUP", "1")
    entries = []
    for slices in (1, 2):
        for k, n in ((HIDDEN, 2 * INTER // slices), (INTER, HIDDEN)):
            for m, route in [(m, "grouped") for m in TABLE_MS] + [(1, "direct"), (16, "direct")]:
                # configs that differ by bucket, so a variant of one bucket cannot stand in for another's
                config = {"split_k": 1 + TABLE_MS.index(m) if route == "grouped" else 2, "shrink_block_k": 16}
                config |= {"expand_block_n": 16 if m < 64 else 32, "one_pass_block_n": 16 if m == 1 else 32}
                entry = {"k": k, "n": n, "rank": RANK, "num_experts": EXPERTS, "max_loras": LORAS, "m": m}
                entries.append(entry | {"config": config, "route": route})
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"entries": entries}))
    monkeypatch.setattr(launch_config, "_config_file", lambda device: table)
    return keys


def _serve(m: int, slices: int) -> None:
    """One MoE layer's LoRA calls as vLLM makes them for a batch of m tokens (w13, then w2 with its four values)."""
    g = torch.Generator().manual_seed(m)
    wrapper = SimpleNamespace(
        lora_config=SimpleNamespace(specialize_active_lora=False),
        token_mapping_meta=SimpleNamespace(meta_args=lambda n, spec: (None,) * 5 + (torch.tensor([False]), None)),
    )
    layer = _weights(slices)
    common = {"w1": None, "w2": None, "top_k_num": TOP_K, "max_loras": LORAS, "adapter_enabled": None, "top_k": TOP_K}
    common |= {"fully_sharded": False, "use_tuned_config": False, "add_inputs": True}
    topk_w = torch.rand(m, TOP_K, generator=g)
    values = moe_hooks.add_lora_w13(
        wrapper,
        y=torch.zeros(m, TOP_K, 2 * INTER),
        x=torch.zeros(m, HIDDEN),
        lora_a_stacked=layer["a13"],
        lora_b_stacked=layer["b13"],
        topk_ids=torch.randint(0, EXPERTS, (m, TOP_K), generator=g, dtype=torch.int32),
        topk_weights=topk_w,
        expert_map=None,
        num_tokens=m,
        local_num_experts=EXPERTS,
        num_slices=slices,
        token_lora_mapping=torch.randint(0, LORAS, (m,), generator=g, dtype=torch.int32),
        **common,
    )
    moe_hooks.add_lora_w2(
        wrapper,
        y=torch.zeros(m, TOP_K, HIDDEN),
        x=torch.zeros(m * TOP_K, INTER),
        lora_a_stacked=layer["a2"],
        lora_b_stacked=layer["b2"],
        topk_weights=topk_w,
        sorted_token_ids_lora=values[0],
        expert_ids_lora=values[1],
        num_tokens_post_padded_lora=values[2],
        token_lora_mapping=values[3],
        num_tokens=m,
        tp_rank=0,
        **common,
    )


_WEIGHTS: dict[int, dict] = {}


def _weights(slices: int) -> dict:
    if slices not in _WEIGHTS:
        _WEIGHTS[slices] = {
            "a13": tuple(torch.zeros(LORAS, EXPERTS, RANK, HIDDEN) for _ in range(slices)),
            "b13": tuple(torch.zeros(LORAS, EXPERTS, 2 * INTER // slices, RANK) for _ in range(slices)),
            "a2": (torch.zeros(LORAS, EXPERTS, RANK, INTER),),
            "b2": (torch.zeros(LORAS, EXPERTS, HIDDEN, RANK),),
        }
    return _WEIGHTS[slices]


@pytest.mark.parametrize("slices", [1, 2])
@pytest.mark.parametrize("method", ["grouped", "decode"])
def test_warm_up_compiles_every_variant_served_afterwards(recorded, monkeypatch, method, slices):
    monkeypatch.setenv("MOELORA_ROUTING", method)
    # every token count up to past the last routing switch (1024 pairs: multi), in any order
    counts = [*range(1, 130), 255, 256, 257, 511, 512, 513, 514, 600, 1000, 1030]
    for m in [40, *counts]:
        _serve(m, slices)
    warm, served = recorded["warm"], recorded["serve"]
    assert len(warm) > 8  # the warm-up ran, once: the first call's layer shape
    missing = sorted(served - warm, key=repr)
    assert not missing, f"{len(missing)} variants compiled while serving:\n" + "\n".join(
        _nearest_difference(k, warm) for k in missing
    )


def _nearest_difference(key: tuple, warm: set) -> str:
    """What sets a missing variant apart from the warm-up's closest variant of the same kernel."""
    name, params, options = key
    best = None
    for other_name, other_params, other_options in warm:
        if other_name == name:
            diff = {p: v for (p, v), (_, w) in zip(params, other_params) if v != w}
            diff |= {"options": options} if options != other_options else {}
            best = diff if best is None or len(diff) < len(best) else best
    return f"{name}: {best if best is not None else 'never launched by the warm-up'}"


def test_warm_ms_take_each_side_of_every_routing_switch(recorded):
    # top_k 2: tiny's block grows past 16 pairs (m 8 | 9), tiny ends at 32 (16 | 17), onepass at 128 (64 | 65),
    # single at 1024 (512 | 513); and the table's buckets.
    assert moe_hooks._warm_ms(top_k=2, device=torch.device("cpu")) == (1, 8, 9, 16, 17, 64, 65, 512, 513)
    assert moe_hooks._warm_ms(top_k=8, device=torch.device("cpu")) == (1, 2, 3, 4, 5, 16, 17, 64, 128, 129)
