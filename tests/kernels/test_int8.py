"""Expert LoRA weights in int8 with a scale per rank (moelora.kernels.quant), in Triton's interpreter: the op on int8
weights computes exactly the LoRA of the dequantized weights, rounding costs the contribution about a percent, and
an empty slot adds nothing."""

from __future__ import annotations

import pytest
import torch

from moelora.kernels import KernelConfig, dequantize_expert_lora, moe_lora_reference, quantize_expert_lora

from .ops import run_op
from .test_slices import make_case


def _quantized(case):
    """The case's weights in int8, their stacked scales (slices, L, E, r), and the float weights they stand for."""
    parts = [quantize_expert_lora(a, b) for a, b in zip(case["lora_a"], case["lora_b"], strict=True)]
    qa = tuple(p[0] for p in parts)
    qb = tuple(p[1] for p in parts)
    scale = torch.stack([p[2] for p in parts]).contiguous()
    deq = [dequantize_expert_lora(*p, dtype=torch.float32) for p in parts]
    return qa, qb, scale, {"lora_a": tuple(d[0] for d in deq), "lora_b": tuple(d[1] for d in deq)}


def _run(case, lora_a, lora_b, *, scale, method, cfg, mul_routed_weight):
    return run_op(
        case | {"lora_a": lora_a, "lora_b": lora_b},
        method=method,
        config=cfg,
        mul_routed_weight=mul_routed_weight,
        scale=scale,
    )


@pytest.mark.parametrize("slices", [1, 2])
@pytest.mark.parametrize(
    "method, mul, cfg",
    [
        # grouped with readiness counters, split-K 3, ragged N tiles
        ("single", False, KernelConfig(split_k=3, shrink_block_k=16, expand_block_n=16, expand_tiles=2)),
        # grouped, the grid-wide wait, the routed weight
        ("tiny", True, KernelConfig(split_k=2, shrink_block_k=32, expand_block_n=16, wait_per_block=False)),
        # direct: vector math per pair
        ("direct", True, KernelConfig(split_k=2, shrink_block_k=16, expand_block_n=16, expand_tiles=2)),
        # decode routing asks for the one-pass kernel, which takes no scales: the op runs as shrink and expand
        ("decode", False, KernelConfig(split_k=2, shrink_block_k=16, expand_block_n=16, one_pass_block_k=16)),
    ],
)
def test_int8_op_is_the_lora_of_the_dequantized_weights(slices, method, mul, cfg):
    case = make_case(m=9, top_k=3, e=5, loras=3, rank=12, k=72, n=40, dtype=torch.float32, seed=slices)
    case["lora_a"], case["lora_b"] = case["lora_a"][:slices], case["lora_b"][:slices]
    case["output"] = case["output"][:, :, : slices * 40].contiguous()
    qa, qb, scale, dequant = _quantized(case)
    out = _run(case, qa, qb, scale=scale, method=method, cfg=cfg, mul_routed_weight=mul)
    ref = moe_lora_reference(mul_routed_weight=mul, **(case | dequant))
    none = case["token_lora_mapping"] < 0
    assert torch.equal(out[none], case["output"][none])
    base = case["output"].double()
    err = ((out.double() - ref).norm() / (ref - base).norm()).item()
    assert err < 1e-5


def test_int8_rounding_costs_the_contribution_about_a_percent():
    # Weights shaped like a trained adapter's (A ~ 1/sqrt(K), B small), against the exact float contribution.
    case = make_case(m=16, top_k=2, e=4, loras=2, rank=16, k=256, n=96, dtype=torch.float32, seed=7, none_frac=0)
    case["lora_b"] = tuple(b * 0.01 for b in case["lora_b"])
    qa, qb, scale, dequant = _quantized(case)
    exact = moe_lora_reference(**case)
    quant = moe_lora_reference(**(case | dequant))
    base = case["output"].double()
    rel = ((quant - exact).norm() / (exact - base).norm()).item()
    assert 1e-4 < rel < 0.015
    # Every weight within half a step of its rank's scale.
    for a, q, s in zip(case["lora_a"], qa, (p for p in torch.unbind(scale)), strict=True):
        step_a = a.abs().amax(-1, keepdim=True) / 127
        assert ((q.float() * step_a - a).abs() <= step_a / 2 + 1e-7).all()
        assert torch.all(s >= 0)


def test_an_empty_slot_adds_nothing_and_divides_by_nothing():
    case = make_case(m=8, top_k=2, e=4, loras=2, rank=8, k=32, n=16, dtype=torch.float32, seed=3, none_frac=0)
    for a, b in zip(case["lora_a"], case["lora_b"], strict=True):
        a[1].zero_()
        b[1].zero_()
    qa, qb, scale, _ = _quantized(case)
    assert torch.isfinite(scale).all() and not scale[:, 1].any() and not qa[0][1].any()
    out = _run(case, qa, qb, scale=scale, method="single", cfg=None, mul_routed_weight=False)
    slot1 = case["token_lora_mapping"] == 1
    assert slot1.any() and torch.equal(out[slot1], case["output"][slot1])
    assert not torch.equal(out[~slot1], case["output"][~slot1])


def test_int8_weights_and_scales_come_together_and_in_shape():
    case = make_case(m=4, top_k=2, e=4, loras=2, rank=8, k=32, n=16, dtype=torch.float32, seed=5)
    qa, qb, scale, _ = _quantized(case)
    kw = {"method": "single", "cfg": None, "mul_routed_weight": False}
    with pytest.raises(ValueError, match="need a scale"):
        _run(case, qa, qb, scale=None, **kw)
    with pytest.raises(ValueError, match="need a scale"):
        _run(case, case["lora_a"], case["lora_b"], scale=scale, **kw)
    with pytest.raises(ValueError, match="need a scale"):
        _run(case, qa, case["lora_b"], scale=scale, **kw)
    with pytest.raises(ValueError, match="scale must be contiguous float32"):
        _run(case, qa, qb, scale=scale[:1], **kw)
    with pytest.raises(ValueError, match="disagree"):
        quantize_expert_lora(case["lora_a"][0], case["lora_b"][0][..., :4])


def test_the_error_tool_sees_no_error_on_the_int8_grid_and_some_off_it(capsys):
    from moelora.kernels.tools import int8_error

    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 8, 64, generator=g, dtype=torch.float64)
    on_grid_a = torch.randint(-127, 128, (2, 16, 64), generator=g).float() / 256  # each rank's max is 127 / 256
    on_grid_a[:, :, 0] = 127 / 256
    on_grid_b = torch.randint(-127, 128, (2, 32, 16), generator=g).float() / 512
    on_grid_b[:, 0, :] = 127 / 512
    assert int8_error.relative_error(on_grid_a, on_grid_b, x) < 1e-12
    a, b = int8_error.weights("gaussian", 2, 16, 64, 32, g)
    assert 1e-3 < int8_error.relative_error(a, b, x) < 0.05
    assert int8_error.main(["--experts", "1", "--tokens", "4"]) == 0
    assert capsys.readouterr().out.count("%") == 12
