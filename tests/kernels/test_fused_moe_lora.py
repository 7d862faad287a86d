"""The fused MoE-LoRA op and its routing against the PyTorch reference, in Triton's interpreter (fp32/fp16).

Shapes are small and deliberately odd (K, N, rank not multiples of the tiles) so that every mask is exercised.
Errors are measured on the LoRA contribution alone (out - base against ref - base), so a missing or doubled
contribution fails; fp32 lands near 1e-7, fp16 near 5e-4 (operands and the rank intermediate rounded to fp16).
"""

from __future__ import annotations

import pytest
import torch

from moelora.kernels import KernelConfig, fused_moe_lora, moe_lora_reference, moe_lora_routing

from .ops import TOL, delta_error, routing_of, run_op


def make_case(*, m, top_k, e, loras, rank, k, n, dtype, per_pair, seed, none_frac=0.25):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, top_k, k, generator=g) if per_pair else torch.randn(m, k, generator=g)
    a = torch.randn(loras, e, rank, k, generator=g) / k**0.5
    b = torch.randn(loras, e, n, rank, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    lora_map = torch.randint(0, loras, (m,), generator=g)
    lora_map[torch.rand(m, generator=g) < none_frac] = -1
    weights = torch.rand(m, top_k, generator=g)
    out = torch.randn(m, top_k, n, generator=g)
    return {
        "x": x.to(dtype),
        "lora_a": a.to(dtype),
        "lora_b": b.to(dtype),
        "topk_ids": ids,
        "token_lora_mapping": lora_map,
        "topk_weights": weights,
        "output": out.to(dtype),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "per_pair, rank, k, n, cfg",
    [
        # gate_up-like: x shared by the top-k slots; uneven K and N tiles, rank 8 padded to 16, split-K 3
        (False, 8, 80, 48, KernelConfig(split_k=3, shrink_block_k=32, expand_block_n=32)),
        # down-like: one x row per slot, routed weights; even tiles, rank 20 padded to 32
        (True, 20, 64, 64, KernelConfig(split_k=2, shrink_block_k=16, expand_block_n=16, expand_tiles=4)),
        # rank 16 unpadded, EVEN_K with one K step per split
        (False, 16, 48, 40, KernelConfig(split_k=3, shrink_block_k=16, expand_block_n=16, expand_tiles=2)),
    ],
)
def test_op_matches_reference(dtype, per_pair, rank, k, n, cfg):
    case = make_case(m=7, top_k=3, e=5, loras=3, rank=rank, k=k, n=n, dtype=dtype, per_pair=per_pair, seed=rank)
    out = run_op(case, config=cfg, mul_routed_weight=per_pair)
    assert delta_error(case, out, per_pair) < TOL[dtype]


@pytest.mark.parametrize("method", ["direct", "tiny", "single", "multi"])
def test_every_routing_method_gives_the_same_result(method):
    case = make_case(m=30, top_k=4, e=5, loras=2, rank=16, k=32, n=24, dtype=torch.float32, per_pair=True, seed=2)
    out = run_op(
        case,
        method=method,
        mul_routed_weight=True,
        config=KernelConfig(split_k=2, shrink_block_k=16, expand_block_n=32),
    )
    assert delta_error(case, out, True) < TOL[torch.float32]


@pytest.mark.parametrize("method", ["direct", "tiny", "single"])
def test_pairs_off_this_rank_are_skipped(method):
    # expert -1 (expert parallelism: not on this rank) and adapter slots past max_loras take no part; the output
    # rows of those pairs keep their exact base values.
    case = make_case(
        m=12, top_k=3, e=4, loras=2, rank=8, k=32, n=16, dtype=torch.float32, per_pair=False, seed=13, none_frac=0.0
    )
    case["topk_ids"][::4, 1] = -1
    case["token_lora_mapping"][1::5] = 2
    out = run_op(case, method=method, config=KernelConfig(split_k=2, shrink_block_k=16, expand_block_n=16))
    skipped = (case["topk_ids"] < 0) | (case["token_lora_mapping"] >= 2)[:, None]
    assert skipped.any() and (~skipped).any()
    assert torch.equal(out[skipped], case["output"][skipped])
    assert delta_error(case, out) < TOL[torch.float32]


@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_many_pairs_multi_cta_routing(block_m):
    # 400 x 3 = 1200 pairs > 1024: the two-launch routing path; few groups so blocks fill and split
    case = make_case(m=400, top_k=3, e=4, loras=2, rank=8, k=32, n=24, dtype=torch.float32, per_pair=False, seed=3)
    out = run_op(case, block_m=block_m, config=KernelConfig(split_k=1, shrink_block_k=32, expand_block_n=32))
    assert delta_error(case, out) < TOL[torch.float32]


def test_each_op_counts_its_blocks_ready_in_its_own_slot():
    # The shrink's split-K CTAs each add one to their block's counter; the expand waits for SPLIT_K there. Ops on
    # one routing take slots in launch order; past READY_SLOTS they wait for the whole shrink grid instead.
    from moelora.kernels.routing import READY_SLOTS

    case = make_case(m=20, top_k=2, e=4, loras=2, rank=8, k=48, n=16, dtype=torch.float32, per_pair=False, seed=19)
    routing = routing_of(case, method="single")
    assert routing.ready is not None and routing.ready.shape[0] == READY_SLOTS
    # every op's slot 16-byte aligned (Triton specialises pointers on it) with room for every block
    assert routing.ready.shape[1] >= routing.max_blocks and routing.max_blocks % 4 != 0
    assert all(routing.ready[i].data_ptr() % 16 == 0 for i in range(READY_SLOTS))
    assert not routing.ready.any()  # zeroed by the routing kernel (torch.empty before)
    out = case["output"].clone()
    live = int(routing.num_blocks)
    for op, split_k in enumerate((3, 2, 1, 3, 2)):
        fused_moe_lora(
            output=out,
            x=case["x"],
            lora_a=case["lora_a"],
            lora_b=case["lora_b"],
            routing=routing,
            config=KernelConfig(split_k=split_k, shrink_block_k=16, expand_block_n=16),
        )
        if op < READY_SLOTS:
            assert routing.ready[op, :live].tolist() == [split_k] * live
            assert not routing.ready[op, live:].any()
    # Five additions of the same contribution, each through a different path (counters or the grid-wide wait).
    base = case["output"].double()
    one = moe_lora_reference(**case) - base
    assert ((out.double() - base - 5 * one).norm() / (5 * one).norm()).item() < TOL[torch.float32]


def test_direct_routing_has_no_counters():
    case = make_case(m=4, top_k=2, e=4, loras=2, rank=8, k=32, n=16, dtype=torch.float32, per_pair=False, seed=23)
    routing = routing_of(case, method="direct")
    assert routing.ready is None and routing.begin_op(per_block_wait=True) == (False, None)


def test_default_config_and_rank_128():
    case = make_case(m=5, top_k=2, e=3, loras=2, rank=128, k=48, n=32, dtype=torch.float32, per_pair=True, seed=7)
    out = run_op(case, mul_routed_weight=True)
    assert delta_error(case, out, True) < TOL[torch.float32]


def test_tokens_without_adapter_are_untouched():
    case = make_case(
        m=9, top_k=2, e=4, loras=2, rank=8, k=32, n=16, dtype=torch.float32, per_pair=False, seed=11, none_frac=0.5
    )
    none = case["token_lora_mapping"] < 0
    assert none.any() and (~none).any()
    out = run_op(case)
    assert torch.equal(out[none], case["output"][none])
    assert not torch.equal(out[~none], case["output"][~none])


def test_no_adapter_at_all_leaves_output_unchanged():
    case = make_case(
        m=6, top_k=2, e=3, loras=2, rank=8, k=32, n=16, dtype=torch.float32, per_pair=False, seed=5, none_frac=1.0
    )
    assert torch.equal(run_op(case), case["output"])


def test_output_column_slice_of_wider_buffer():
    case = make_case(m=6, top_k=2, e=3, loras=2, rank=8, k=32, n=24, dtype=torch.float32, per_pair=False, seed=9)
    wide = torch.randn(6, 2, 40)
    wide[..., 10:34] = case["output"]
    routing = routing_of(case)
    before = wide.clone()
    fused_moe_lora(
        output=wide[..., 10:34],
        x=case["x"],
        lora_a=case["lora_a"],
        lora_b=case["lora_b"],
        routing=routing,
        config=KernelConfig(expand_block_n=16),
    )
    assert torch.equal(wide[..., :10], before[..., :10]) and torch.equal(wide[..., 34:], before[..., 34:])
    assert delta_error(case, wide[..., 10:34]) < TOL[torch.float32]


@pytest.mark.parametrize(
    "m, top_k, block_m, method",
    [
        (7, 3, 16, "tiny"),
        (7, 3, 16, "single"),
        (7, 3, 16, "multi"),
        (42, 3, 16, "tiny"),
        (60, 4, 16, "tiny"),
        (200, 5, 16, "single"),
        (500, 4, 32, "multi"),
    ],
)
def test_routing_groups_every_valid_pair_once(m, top_k, block_m, method):
    g = torch.Generator().manual_seed(m)
    e, loras = 6, 3
    ids = torch.randint(-1, e, (m, top_k), generator=g)  # -1: expert not on this rank
    lora_map = torch.randint(-1, loras + 1, (m,), generator=g)  # -1: none; == loras: out of range
    r = moe_lora_routing(
        topk_ids=ids, token_lora_mapping=lora_map, num_experts=e, max_loras=loras, block_m=block_m, method=method
    )
    pairs_lora = lora_map.repeat_interleave(top_k)
    flat = ids.view(-1)
    valid = (pairs_lora >= 0) & (pairs_lora < loras) & (flat >= 0)
    group_of = pairs_lora * e + flat
    nb = int(r.num_blocks)
    assert nb <= r.max_blocks
    assert not r.ready.any()  # every grouping kernel zeroes the readiness counters
    seen = []
    for b in range(nb):
        grp, start, end = (int(v) for v in r.block_table[:, b])
        assert 0 < end - start <= block_m
        members = r.sorted_pairs[start:end].long()
        assert bool((group_of[members] == grp).all())
        seen.extend(members.tolist())
    assert sorted(seen) == torch.nonzero(valid).view(-1).tolist()


def test_routing_method_names_resolve_by_pair_count():
    from moelora.kernels.routing import resolve_method

    # 256 groups: direct while pairs <= 128; grouped by size: tiny <= 32, single <= 1024, multi beyond
    assert [resolve_method("auto", p, 256) for p in (4, 128, 129, 1024, 1025)] == [
        "direct",
        "direct",
        "single",
        "single",
        "multi",
    ]
    assert [resolve_method("grouped", p, 256) for p in (32, 33, 128)] == ["tiny", "single", "single"]
    assert resolve_method("multi", 4, 256) == "multi"


def test_rejects_bad_shapes():
    case = make_case(m=4, top_k=2, e=3, loras=2, rank=8, k=32, n=16, dtype=torch.float32, per_pair=False, seed=1)
    routing = routing_of(case)
    with pytest.raises(ValueError, match="x must be"):
        fused_moe_lora(
            output=case["output"], x=case["x"][:, :16], lora_a=case["lora_a"], lora_b=case["lora_b"], routing=routing
        )
    with pytest.raises(ValueError, match="mul_routed_weight"):
        fused_moe_lora(
            output=case["output"],
            x=case["x"],
            lora_a=case["lora_a"],
            lora_b=case["lora_b"],
            routing=routing,
            mul_routed_weight=True,
            topk_weights=None,
        )
    with pytest.raises(ValueError, match="block_m"):
        moe_lora_routing(
            topk_ids=case["topk_ids"],
            token_lora_mapping=case["token_lora_mapping"],
            num_experts=3,
            max_loras=2,
            block_m=24,
        )


def test_each_routing_method_takes_the_pair_counts_it_can_hold():
    from moelora.kernels.routing import method_takes

    assert [method_takes("tiny", p) for p in (256, 257)] == [True, False]
    assert [method_takes("single", p) for p in (1024, 1025)] == [True, False]
    assert method_takes("multi", 1 << 20) and method_takes("direct", 1 << 20)
    with pytest.raises(ValueError, match="cannot take 260 pairs"):
        moe_lora_routing(
            topk_ids=torch.zeros(65, 4, dtype=torch.int32),
            token_lora_mapping=torch.zeros(65),
            num_experts=4,
            max_loras=2,
            block_m=16,
            method="tiny",
        )


def test_splits_are_whole_and_never_empty():
    # 5 K steps in 4 splits would leave the last split empty: the op runs 3 splits of 2, 2 and 1 steps, and the
    # expand waits for 3 ready counts.
    case = make_case(m=6, top_k=2, e=2, loras=2, rank=8, k=40, n=16, dtype=torch.float32, per_pair=False, seed=29)
    routing = routing_of(case, method="single")
    out = run_op(case, routing=routing, config=KernelConfig(split_k=4, shrink_block_k=8, expand_block_n=16))
    live = int(routing.num_blocks)
    assert routing.ready[0, :live].tolist() == [3] * live
    assert delta_error(case, out) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_second_op_on_a_routing_matches_reference(dtype):
    # A layer's gate_up op, then its down op (x per pair, routed weights) on the same routing. The second op's
    # shrink takes its first A tile before its wait (the routing is settled): K = 56 in 16-wide steps is 4 steps in
    # 2 splits, the last step ragged, so the early tile and the loop after it both count.
    up = make_case(m=9, top_k=2, e=3, loras=2, rank=12, k=56, n=40, dtype=dtype, per_pair=False, seed=23)
    down = make_case(m=9, top_k=2, e=3, loras=2, rank=12, k=56, n=40, dtype=dtype, per_pair=True, seed=24)
    down["topk_ids"], down["token_lora_mapping"] = up["topk_ids"], up["token_lora_mapping"]
    routing = routing_of(up, method="single")
    cfg = KernelConfig(split_k=2, shrink_block_k=16, expand_block_n=16)
    outs = [
        run_op(case, routing=routing, config=cfg, mul_routed_weight=routed)
        for case, routed in ((up, False), (down, True))
    ]
    assert routing.begin_op(per_block_wait=True)[0]  # two ops began before this call
    assert delta_error(up, outs[0]) < TOL[dtype]
    assert delta_error(down, outs[1], True) < TOL[dtype]
