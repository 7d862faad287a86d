"""The one-kernel op (onepass routing) against the float64 reference, in Triton's interpreter.

The interpreter runs a grid's programs one after another, so the launcher runs the kernel's two halves (shrinks,
then expands) as two launches of the same code; these tests check the arithmetic, the K and N spans of each CTA, the
partial sums' hand-over and the counters' return to zero. Whether the CTAs really wait for each other is the GPU
tests' part (tests/gpu). Shapes are small and odd so every mask is exercised.
"""

from __future__ import annotations

import pytest
import torch

from moelora.kernels import KernelConfig, moe_lora_routing
from moelora.kernels.residency import SPLIT_PAD, _counters, onepass_split

from .ops import TOL, delta_error, routing_of, run_op


def make_case(*, m, top_k, e, loras, rank, k, n, dtype, per_pair, seed):
    """One op's inputs; a quarter of the tokens have no adapter."""
    g = torch.Generator().manual_seed(seed)
    lora_map = torch.randint(0, loras, (m,), generator=g)
    lora_map[torch.rand(m, generator=g) < 0.25] = -1
    x = torch.randn(m, top_k, k, generator=g) if per_pair else torch.randn(m, k, generator=g)
    return {
        "x": x.to(dtype),
        "lora_a": (torch.randn(loras, e, rank, k, generator=g) / k**0.5).to(dtype),
        "lora_b": torch.randn(loras, e, n, rank, generator=g).to(dtype),
        "topk_ids": torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32),
        "token_lora_mapping": lora_map,
        "topk_weights": torch.rand(m, top_k, generator=g),
        "output": torch.randn(m, top_k, n, generator=g).to(dtype),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "per_pair, rank, k, n, cfg",
    [
        # gate_up-like: K 80 in 16-wide tiles over 3 CTAs (2, 2, 1 tiles), N 48 ragged over 32-wide tiles
        (False, 8, 80, 48, KernelConfig(one_pass_block_k=16, one_pass_block_n=32, one_pass_max_split=3)),
        # down-like: routed weights, rank 20 padded to 32, even tiles, several N tiles per CTA after the first
        (True, 20, 64, 64, KernelConfig(one_pass_block_k=16, one_pass_block_n=16, one_pass_max_split=2)),
        # one CTA per pair: no exchange at all
        (False, 16, 48, 40, KernelConfig(one_pass_block_k=16, one_pass_block_n=16, one_pass_max_split=1)),
        # K ragged (56 = 3.5 tiles), as many splits as K tiles, some CTAs with no N columns
        (True, 12, 56, 16, KernelConfig(one_pass_block_k=16, one_pass_block_n=16)),
    ],
)
def test_one_kernel_op_matches_reference(dtype, per_pair, rank, k, n, cfg):
    case = make_case(m=7, top_k=3, e=5, loras=3, rank=rank, k=k, n=n, dtype=dtype, per_pair=per_pair, seed=rank)
    out = run_op(case, config=cfg, mul_routed_weight=per_pair, method="onepass")
    assert delta_error(case, out, per_pair) < TOL[dtype]
    # every row's base has moved on to its arrival count, ready for the next op
    assert all(torch.equal(buf[0::2], buf[1::2]) for buf in _counters.values())  # arrivals == base


def test_one_kernel_op_gives_the_two_kernel_result():
    # Same pairs, same sums (the rank intermediate rounded alike): the one-kernel op and direct routing's two
    # kernels agree to fp32 rounding, and untouched rows (no adapter) keep their exact base values.
    case = make_case(m=9, top_k=2, e=4, loras=2, rank=16, k=96, n=40, dtype=torch.float32, per_pair=True, seed=31)
    cfg = KernelConfig(split_k=3, shrink_block_k=16, expand_block_n=16, one_pass_block_k=16, one_pass_block_n=16)
    one = run_op(case, config=cfg, mul_routed_weight=True, method="onepass")
    two = run_op(case, config=cfg, mul_routed_weight=True, method="direct")
    assert torch.allclose(one, two, rtol=1e-5, atol=1e-5)
    none = case["token_lora_mapping"] < 0
    assert none.any() and torch.equal(one[none], case["output"][none])


def test_two_slices_and_a_second_op_on_the_routing():
    # Qwen3's gate_up (two slices, own A and B each, output columns [s * N, (s + 1) * N)), then the down op on the
    # same routing: the second op reads the routing and its first A tile before its wait (ROUTING_SETTLED).
    g = torch.Generator().manual_seed(41)
    m, top_k, e, loras, rank, h, inter = 6, 3, 5, 2, 12, 72, 40
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    lora_map = torch.tensor([0, 1, -1, 1, 0, 1])
    up = {
        "x": torch.randn(m, h, generator=g),
        "lora_a": tuple(torch.randn(loras, e, rank, h, generator=g) / h**0.5 for _ in range(2)),
        "lora_b": tuple(torch.randn(loras, e, inter, rank, generator=g) for _ in range(2)),
        "topk_ids": ids,
        "token_lora_mapping": lora_map,
        "topk_weights": torch.rand(m, top_k, generator=g),
        "output": torch.randn(m, top_k, 2 * inter, generator=g),
    }
    down = dict(
        up,
        x=torch.randn(m, top_k, inter, generator=g),
        lora_a=torch.randn(loras, e, rank, inter, generator=g) / inter**0.5,
        lora_b=torch.randn(loras, e, h, rank, generator=g),
        output=torch.randn(m, top_k, h, generator=g),
    )
    routing = routing_of(up, method="onepass")
    cfg = KernelConfig(one_pass_block_k=16, one_pass_block_n=16, one_pass_max_split=4)
    got = [
        run_op(case, routing=routing, config=cfg, mul_routed_weight=routed)
        for case, routed in ((up, False), (down, True))
    ]
    assert delta_error(up, got[0], False) < TOL[torch.float32]
    assert delta_error(down, got[1], True) < TOL[torch.float32]


def test_split_fills_the_room_with_whole_tiles():
    # 4 pairs x 1 slice in 132 x 2 resident CTAs: up to SPLIT_PAD CTAs each; K 2880 = 45 tiles of 64 -> 2 tiles per
    # CTA, 23 CTAs; N 5760 = 22.5 tiles of 256 -> one tile per CTA.
    assert onepass_split(units=4, room=264, k=2880, n=5760, block_k=64, block_n=256) == (23, 2, 1)
    # more rows than room: no one-kernel op
    assert onepass_split(units=300, room=264, k=2880, n=5760, block_k=64, block_n=256) == (0, 0, 0)
    # a row of CTAs per (pair, slice) when the room is just enough; K shorter than the split's wish
    assert onepass_split(units=264, room=264, k=2048, n=768, block_k=64, block_n=256) == (1, 32, 3)
    assert onepass_split(units=1, room=1000, k=100, n=64, block_k=64, block_n=16)[0] == 2
    assert SPLIT_PAD >= onepass_split(units=1, room=10_000, k=1 << 16, n=64, block_k=16, block_n=16)[0]


def test_decode_runs_one_kernel_per_op_up_to_128_pairs_and_auto_never():
    from moelora.kernels.routing import resolve_method

    assert [resolve_method("decode", p, 256) for p in (4, 128, 129, 2000)] == ["onepass", "onepass", "single", "multi"]
    assert [resolve_method("auto", p, 1024) for p in (4, 512, 513)] == ["direct", "direct", "single"]
    r = moe_lora_routing(
        topk_ids=torch.zeros(2, 2, dtype=torch.int32),
        token_lora_mapping=torch.zeros(2, dtype=torch.int32),
        num_experts=2,
        max_loras=1,
        block_m=16,
        method="decode",
    )
    assert r.direct and r.one_pass
