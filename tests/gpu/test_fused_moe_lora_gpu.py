"""The fused MoE-LoRA op at real model shapes, bf16, on a CUDA GPU (skipped without one).

Run in its own pytest process, apart from tests/kernels (which forces Triton's interpreter).
Errors are measured on the LoRA contribution (out - base against ref - base, ref in float64): bf16 operands and
the bf16-rounded rank intermediate land near 4e-3; the bound is 2e-2.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter forced"),
]

TOL = 2e-2
MODELS = {"gpt-oss": (2880, 2880, 32, 4), "qwen3": (2048, 768, 128, 8)}


@pytest.fixture(scope="module")
def k():
    from moelora import kernels
    from moelora.kernels.tools import bench

    return kernels, bench


def delta_err(out, ref, base):
    return ((out.double() - ref).norm() / (ref - base.double()).norm()).item()


def layer_check(k, model, rank, adapters, m, none_frac=0.2, seed=0, route="auto", int8=False):
    """The layer's two ops against the float64 reference: with int8, against the weights the int8 ones stand for."""
    kernels, bench = k
    inp = bench.make_inputs(model, rank, adapters, m, seed=seed, int8=int8)
    # Base outputs of the LoRA delta's size: a bf16 output of magnitude 1 would round the (routed-weight-scaled,
    # ~1e-2) down delta by more than the kernel's own error.
    inp.gate_up_out.mul_(0.1)
    inp.down_out.mul_(0.01)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    inp.lora_map[torch.rand(m, generator=g, device="cuda") < none_frac] = -1
    cpu = {
        n: tuple(s.cpu() for s in t) if isinstance(t, tuple) else t.cpu() for n, t in vars(inp).items() if t is not None
    }
    if int8:
        w13 = [kernels.dequantize_expert_lora(*q) for q in zip(cpu["w13_a"], cpu["w13_b"], cpu["w13_scale"])]
        cpu["w13_a"], cpu["w13_b"] = tuple(w[0] for w in w13), tuple(w[1] for w in w13)
        cpu["w2_a"], cpu["w2_b"] = kernels.dequantize_expert_lora(cpu["w2_a"], cpu["w2_b"], cpu["w2_scale"][0])
    ref13, ref2 = kernels.moe_lora_layer_reference(
        gate_up_out=cpu["gate_up_out"],
        down_out=cpu["down_out"],
        hidden=cpu["hidden"],
        down_in=cpu["down_in"],
        w13_a=cpu["w13_a"],
        w13_b=cpu["w13_b"],
        w2_a=cpu["w2_a"],
        w2_b=cpu["w2_b"],
        topk_ids=cpu["topk_ids"],
        topk_weights=cpu["topk_weights"],
        token_lora_mapping=cpu["lora_map"],
    )
    cfg = bench.default_layer_config(inp, route_method=route)
    bench.run_layer(inp, cfg)
    torch.cuda.synchronize()
    none = cpu["lora_map"] < 0
    assert torch.equal(inp.gate_up_out.cpu()[none], cpu["gate_up_out"][none])
    assert torch.equal(inp.down_out.cpu()[none], cpu["down_out"][none])
    return delta_err(inp.gate_up_out.cpu(), ref13, cpu["gate_up_out"]), delta_err(
        inp.down_out.cpu(), ref2, cpu["down_out"]
    )


def replays_give(inp, base, expected, run, *, replays=1):
    """Capture run() in one CUDA graph; every replay, from the base outputs, leaves the expected outputs bit for bit."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(replays):
        inp.gate_up_out.copy_(base[0])
        inp.down_out.copy_(base[1])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(inp.gate_up_out, expected[0]) and torch.equal(inp.down_out, expected[1])


@pytest.mark.parametrize(
    "model, rank, adapters, m",
    [
        ("gpt-oss", 32, 8, 1),
        ("gpt-oss", 32, 8, 16),
        ("gpt-oss", 32, 8, 300),
        ("gpt-oss", 16, 3, 257),
        ("qwen3", 32, 8, 16),
        ("qwen3", 64, 4, 130),
        ("qwen3", 8, 2, 33),
        ("gpt-oss", 128, 2, 20),
        ("gpt-oss", 32, 8, 60),
    ],
)
def test_layer_matches_reference(k, model, rank, adapters, m):
    e13, e2 = layer_check(k, model, rank, adapters, m)
    assert e13 < TOL and e2 < TOL, (e13, e2)


@pytest.mark.parametrize(
    "model, rank, adapters, m",
    [
        ("gpt-oss", 32, 8, 16),
        ("gpt-oss", 32, 8, 64),
        ("qwen3", 32, 8, 16),
        ("qwen3", 16, 3, 5),
    ],
)
def test_direct_routing_matches_reference(k, model, rank, adapters, m):
    e13, e2 = layer_check(k, model, rank, adapters, m, route="direct", seed=m)
    assert e13 < TOL and e2 < TOL, (e13, e2)


def test_large_batch_matches_reference(k):
    # 1600 tokens: the multi-CTA routing path and block_m > 16
    e13, e2 = layer_check(k, "gpt-oss", 32, 8, 1600, seed=4)
    assert e13 < TOL and e2 < TOL, (e13, e2)


def test_deterministic_and_graph_capturable(k):
    _, bench = k
    inp = bench.make_inputs("qwen3", 32, 8, 64, seed=2)
    base13, base2 = inp.gate_up_out.clone(), inp.down_out.clone()
    cfg = bench.default_layer_config(inp)
    bench.run_layer(inp, cfg)
    eager13, eager2 = inp.gate_up_out.clone(), inp.down_out.clone()
    inp.gate_up_out.copy_(base13)
    inp.down_out.copy_(base2)
    bench.run_layer(inp, cfg)
    assert torch.equal(inp.gate_up_out, eager13) and torch.equal(inp.down_out, eager2)
    replays_give(inp, (base13, base2), (eager13, eager2), lambda: bench.run_layer(inp, cfg))


@pytest.mark.parametrize(
    "m, route", [(1, "grouped"), (16, "grouped"), (16, "direct"), (256, "grouped"), (1600, "auto")]
)
def test_qwen3_slices_in_one_op_give_the_bits_of_one_op_per_slice(k, m, route):
    # The one-launch w13 (both slices) against the plugin's former two ops, same launch parameters: the same sums
    # in the same order, so the same bits, eagerly and in a graph replay.
    from dataclasses import replace

    _, bench = k
    inp = bench.make_inputs("qwen3", 32, 8, m, seed=m)
    assert len(inp.w13_a) == 2
    base = inp.gate_up_out.clone(), inp.down_out.clone()
    one_op = bench.default_layer_config(inp, route_method=route)
    expected = layer_from(bench, inp, base, replace(one_op, w13_one_op=False))
    assert layer_from(bench, inp, base, one_op)[0].equal(expected[0])
    replays_give(inp, base, expected, lambda: bench.run_layer(inp, one_op))


def both_ops(cfg, **fields):
    """cfg with the same fields changed in its gate_up and its down op."""
    from dataclasses import replace

    return replace(cfg, w13=replace(cfg.w13, **fields), w2=replace(cfg.w2, **fields))


def layer_from(bench, inp, base, cfg):
    """The two outputs after one layer call with cfg, starting from the base outputs."""
    inp.gate_up_out.copy_(base[0])
    inp.down_out.copy_(base[1])
    bench.run_layer(inp, cfg)
    return inp.gate_up_out.clone(), inp.down_out.clone()


@pytest.mark.parametrize("model, m", [("gpt-oss", 64), ("gpt-oss", 300), ("qwen3", 256)])
def test_per_block_wait_gives_the_grid_wait_result_on_every_replay(k, model, m):
    # Readiness counters (wait_per_block) against the grid-wide wait, same launch parameters otherwise: bitwise the
    # same sums, eagerly and over repeated replays of one graph (the routing kernel re-zeroes the counters each time).
    _, bench = k
    inp = bench.make_inputs(model, 32, 8, m, seed=6)
    base = inp.gate_up_out.clone(), inp.down_out.clone()
    per_block = bench.default_layer_config(inp)
    assert per_block.w13.wait_per_block and per_block.w2.wait_per_block
    grid_wait = both_ops(per_block, wait_per_block=False)
    expected = layer_from(bench, inp, base, grid_wait)
    got = layer_from(bench, inp, base, per_block)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    replays_give(inp, base, expected, lambda: bench.run_layer(inp, per_block), replays=3)


def test_register_caps_change_no_bits(k):
    # shrink_maxnreg / expand_maxnreg only bound the registers ptxas may use (spilling the rest): the same
    # arithmetic in the same order, so the same bits as the uncapped kernels, at a decode size and a prefill size.
    from dataclasses import replace

    _, bench = k
    for m in (64, 300):
        inp = bench.make_inputs("gpt-oss", 32, 8, m, seed=8)
        base = inp.gate_up_out.clone(), inp.down_out.clone()
        uncapped = both_ops(
            bench.default_layer_config(inp, route_method="grouped"), shrink_maxnreg=None, expand_maxnreg=None
        )
        capped = replace(
            uncapped,
            w13=replace(uncapped.w13, shrink_maxnreg=64, expand_maxnreg=72),
            w2=replace(uncapped.w2, shrink_maxnreg=96, expand_maxnreg=48),
        )
        expected = layer_from(bench, inp, base, uncapped)
        got = layer_from(bench, inp, base, capped)
        assert not torch.equal(expected[0], base[0])  # the layer did add something
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize(
    "model, rank, adapters, m",
    [
        ("gpt-oss", 32, 8, 1),  # 4 pairs: many CTAs per pair, the partials handed over inside the kernel
        ("gpt-oss", 32, 8, 16),
        ("gpt-oss", 32, 8, 33),  # 132 pairs: about one CTA per pair
        ("gpt-oss", 128, 2, 3),  # rank 128
        ("qwen3", 32, 8, 1),
        ("qwen3", 32, 8, 16),  # w13: 128 pairs x 2 slices, more CTAs than SMs
        ("qwen3", 64, 4, 5),
        ("gpt-oss", 16, 3, 300),  # 1200 pairs: too many to be resident at once, the two-kernel path runs
    ],
)
def test_one_kernel_op_matches_reference(k, model, rank, adapters, m):
    e13, e2 = layer_check(k, model, rank, adapters, m, route="onepass", seed=m + rank)
    assert e13 < TOL and e2 < TOL, (e13, e2)


@pytest.mark.parametrize("model, m", [("gpt-oss", 1), ("gpt-oss", 16), ("qwen3", 1), ("qwen3", 16)])
def test_one_kernel_op_repeats_its_bits_on_every_replay(k, model, m):
    # Each CTA waits for the partial sums of its pair's other CTAs, and each row's base must move on to its arrival
    # count for the next op (a base left behind lets the next op read partial sums before they are written): four
    # layer calls in a row on the same counters, captured in a graph and replayed five times, give the bits of four
    # eager calls every time.
    from moelora.kernels.residency import _counters

    _, bench = k
    inp = bench.make_inputs(model, 32, 8, m, seed=10 + m)
    base = inp.gate_up_out.clone(), inp.down_out.clone()
    cfg = bench.default_layer_config(inp, route_method="onepass")

    def four_layers() -> None:
        for _ in range(4):
            bench.run_layer(inp, cfg)

    inp.gate_up_out.copy_(base[0])
    inp.down_out.copy_(base[1])
    four_layers()
    expected = inp.gate_up_out.clone(), inp.down_out.clone()
    assert not torch.equal(expected[0], base[0]) and not torch.equal(expected[1], base[1])
    replays_give(inp, base, expected, four_layers, replays=5)
    assert all(torch.equal(buf[0::2], buf[1::2]) for buf in _counters.values())  # arrivals == base


@pytest.mark.parametrize(
    "model, m, route",
    [
        ("qwen3", 16, "auto"),
        ("qwen3", 256, "auto"),
        ("gpt-oss", 64, "auto"),
        ("gpt-oss", 16, "grouped"),
        ("qwen3", 4, "decode"),
    ],
)
def test_int8_weights_give_the_lora_of_the_weights_they_stand_for(k, model, m, route):
    # expert_int8's weights: int8 A and B, the scales' product applied to the intermediate before it is rounded.
    e13, e2 = layer_check(k, model, 32, 8, m, route=route, int8=True)
    assert e13 < TOL and e2 < TOL, (e13, e2)
