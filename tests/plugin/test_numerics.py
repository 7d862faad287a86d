"""The plugin's op against a naive float64 oracle, called with vLLM's own argument list.

Cases follow vLLM's two call shapes: w13 (layer input shared by the top_k slots, two slices gate/up written into
column halves of one output) and w2 (one activation row per pair, routed weights multiplied in), with both routing
forms (naive: expert_ids = topk_ids flattened; blocked: per-adapter sorted pair ids, garbage in unused rows), a
quarter of the tokens without adapter, and odd sizes. Errors are measured on the LoRA contribution alone, so a
missing, doubled or misrouted contribution fails.
"""

from __future__ import annotations

import pytest
import torch

from moelora.vllm_plugin.layout import topk_ids_from_blocks_torch
from moelora.vllm_plugin.op import make_op
from moelora.vllm_plugin.torch_path import moe_lora_torch


def case(*, m=11, top_k=3, e=6, loras=4, rank=8, k=40, n=24, slices=1, per_pair=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m * top_k if per_pair else m, k, generator=g).to(dtype)
    a = [(torch.randn(loras, e, rank, k, generator=g) / k**0.5).to(dtype) for _ in range(slices)]
    b = [torch.randn(loras, e, n, rank, generator=g).to(dtype) for _ in range(slices)]
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    mapping = torch.randint(0, loras - 1, (m,), generator=g).to(torch.int32)  # the last adapter slot stays unused
    mapping[torch.rand(m, generator=g) < 0.25] = -1
    weights = torch.rand(m, top_k, generator=g)
    out = torch.randn(m, top_k, n * slices, generator=g).to(dtype)
    return {
        "x": x,
        "a": a,
        "b": b,
        "ids": ids,
        "mapping": mapping,
        "weights": weights,
        "out": out,
        "m": m,
        "top_k": top_k,
        "n": n,
        "e": e,
        "loras": loras,
        "rank": rank,
    }


def oracle(c, naive, *, mul, add_inputs=True):
    x = c["x"].view(c["m"], c["top_k"], -1) if c["x"].shape[0] != c["m"] else c["x"]
    base = c["out"] if add_inputs else torch.zeros_like(c["out"])
    n = c["n"]
    parts = [
        naive(
            output=base[:, :, i * n : (i + 1) * n],
            x=x,
            lora_a=a,
            lora_b=b,
            topk_ids=c["ids"],
            token_lora_mapping=c["mapping"],
            topk_weights=c["weights"],
            mul_routed_weight=mul,
        )
        for i, (a, b) in enumerate(zip(c["a"], c["b"]))
    ]
    return torch.cat(parts, dim=-1), base


def vllm_args(c, *, blocked, align, block_m=16, mul=False, add_inputs=True, out=None):
    """vLLM's positional argument list for fused_moe_lora (punica_gpu.add_lora_fused_moe)."""
    if blocked:
        sorted_ids, expert_ids, npad = align(
            topk_ids=c["ids"],
            token_lora_mapping=c["mapping"],
            num_experts=c["e"],
            max_loras=c["loras"],
            block_m=block_m,
        )
    else:
        sorted_ids, expert_ids, npad = None, c["ids"].reshape(-1), None
    lora_ids = torch.arange(c["loras"], dtype=torch.int32)
    return (
        out,
        c["x"],
        c["a"],
        c["b"],
        c["weights"],
        sorted_ids,
        expert_ids,
        npad,
        c["mapping"],
        c["rank"],
        c["top_k"],
        lora_ids,
        torch.tensor([c["loras"]]),
        torch.ones(c["loras"] + 1, dtype=torch.int32),
        block_m,
        64,
        32,
        8,
        4,
        3,
        1,
        block_m,
        64,
        32,
        8,
        4,
        3,
        1,
        mul,
        False,
        0,
        add_inputs,
    )


def never(*args):
    raise AssertionError("vLLM's kernel was called")


def rel_err(got, want, base):
    return ((got.double() - want).norm() / (want - base.double()).norm()).item()


@pytest.mark.parametrize("blocked", [False, True], ids=["naive", "blocked"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("op_kind", ["w13", "w2", "w13-overwrite"])
def test_op_matches_oracle(blocked, backend, op_kind, align, naive):
    w2 = op_kind == "w2"
    add_inputs = op_kind != "w13-overwrite"
    c = case(slices=1 if w2 else 2, per_pair=w2, seed=3 * blocked + len(op_kind))
    want, base = oracle(c, naive, mul=w2, add_inputs=add_inputs)
    out = c["out"].clone()
    make_op(original=never, backend=backend)(
        *vllm_args(c, blocked=blocked, align=align, mul=w2, add_inputs=add_inputs, out=out)
    )
    assert rel_err(out, want, base) < 1e-5


def test_bf16_rounds_like_vllm(naive):
    """bf16 operands: the rank intermediate is rounded to bf16 (as vLLM's kernels do); error stays near bf16 eps."""
    c = case(dtype=torch.bfloat16, per_pair=True, k=64, n=32, rank=16)
    want, base = oracle(c, naive, mul=True)
    out = c["out"].clone()
    moe_lora_torch(
        output=out,
        x=c["x"].view(c["m"], c["top_k"], -1),
        lora_a=c["a"][0],
        lora_b=c["b"][0],
        topk_ids=c["ids"],
        token_lora_mapping=c["mapping"],
        topk_weights=c["weights"],
        mul_routed_weight=True,
    )
    assert rel_err(out, want, base) < 2e-2


def test_blocked_layout_inversion(align):
    """topk_ids recovered from the blocked form: exact for pairs with an adapter, -1 for the others, even with
    garbage in the rows and lengths of adapters that have no tokens."""
    c = case(m=37, top_k=4, e=9, loras=5)
    sorted_ids, expert_ids, npad = align(
        topk_ids=c["ids"], token_lora_mapping=c["mapping"], num_experts=9, max_loras=5, block_m=16, seed=3
    )
    got = topk_ids_from_blocks_torch(
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=npad,
        token_lora_mapping=c["mapping"],
        num_tokens=37,
        top_k=4,
        block_m=16,
    )
    has = c["mapping"] >= 0
    assert torch.equal(got[has], c["ids"][has])
    assert (got[~has] == -1).all()
    from moelora.kernels import topk_ids_from_blocks

    tri = topk_ids_from_blocks(
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=npad,
        token_lora_mapping=c["mapping"],
        num_tokens=37,
        top_k=4,
        block_m=16,
    )
    assert torch.equal(tri, got)


def test_unsupported_calls_go_to_vllm(align):
    """Fully sharded LoRA is vLLM's business: the original kernel gets the call, with every argument unchanged."""
    c = case()
    seen = []
    args = list(vllm_args(c, blocked=False, align=align, out=c["out"].clone()))
    args[29] = True  # fully_sharded
    make_op(original=lambda *a: seen.append(a), backend="torch")(*args)
    assert len(seen) == 1 and seen[0][29] is True and seen[0][1] is c["x"]
