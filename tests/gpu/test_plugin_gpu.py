"""The plugin's CUDA extras on a real GPU (skipped without one): the MoE hooks against a float64 oracle in bf16,
their start-up compile, and one compiled variant per configuration across token counts.

Run as tests/gpu is (its own pytest process, PYTHONPATH=kernels:image, no TRITON_INTERPRET)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="Triton interpreter forced"),
]


def _oracle(out, x, a, b, ids, mapping, weights, mul):
    res = out.double().clone()
    for t in range(ids.shape[0]):
        lora = int(mapping[t])
        if lora < 0:
            continue
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            row = (x[t] if x.dim() == 2 else x[t, k]).double()
            d = (row @ a[lora, e].double().T) @ b[lora, e].double().T
            res[t, k] += d * (float(weights[t, k]) if mul else 1.0)
    return res


@pytest.mark.parametrize(
    "top_k, experts, hidden, inter, slices",
    [(4, 32, 2880, 2880, 1), (8, 128, 2048, 768, 2)],  # GPT-OSS-20B (fused gate_up), Qwen3-30B-A3B (gate, up)
    ids=["gpt-oss", "qwen3"],
)
def test_hooks_match_the_oracle_in_bf16(top_k, experts, hidden, inter, slices):
    from moelora.vllm_plugin import moe_hooks

    dev, dt, m, loras, rank = "cuda", torch.bfloat16, 24, 8, 32
    width = 2 * inter // slices
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*s, sc=1.0):
        return (torch.randn(*s, generator=g, device=dev) * sc).to(dt)

    ids = torch.stack([torch.randperm(experts, device=dev)[:top_k] for _ in range(m)]).to(torch.int32)
    mapping = torch.randint(-1, loras, (m,), device=dev, dtype=torch.int32)
    w = torch.rand(m, top_k, device=dev)
    a13 = tuple(rnd(loras, experts, rank, hidden, sc=hidden**-0.5) for _ in range(slices))
    b13 = tuple(rnd(loras, experts, width, rank, sc=0.05) for _ in range(slices))
    a2, b2 = rnd(loras, experts, rank, inter, sc=inter**-0.5), rnd(loras, experts, hidden, rank, sc=0.05)
    x, act = rnd(m, hidden), rnd(m * top_k, inter)
    y13, y2 = rnd(m, top_k, 2 * inter, sc=1e-2), rnd(m, top_k, hidden, sc=1e-2)
    want13 = torch.cat(
        [
            _oracle(y13[:, :, s * width : (s + 1) * width], x, a, b, ids, mapping, w, False)
            for s, (a, b) in enumerate(zip(a13, b13))
        ],
        dim=-1,
    )
    want2 = _oracle(y2, act.view(m, top_k, inter), a2, b2, ids, mapping, w, True)
    w1, w2 = (
        torch.empty(experts, 2 * inter, hidden, device=dev, dtype=dt),
        torch.empty(experts, hidden, inter, device=dev, dtype=dt),
    )
    punica = SimpleNamespace(
        lora_config=SimpleNamespace(specialize_active_lora=False),
        token_mapping_meta=SimpleNamespace(meta_args=lambda n, spec: (None,) * 5 + (torch.tensor([False]), None)),
    )  # "adapters in this batch"
    values = moe_hooks.add_lora_w13(
        punica,
        y13,
        x,
        a13,
        b13,
        ids,
        w,
        None,
        w1,
        w2,
        m,
        top_k,
        loras,
        torch.ones(loras + 1, device=dev),
        experts,
        top_k,
        slices,
        False,
        False,
        add_inputs=True,
        token_lora_mapping=mapping,
    )
    moe_hooks.add_lora_w2(
        punica,
        y2,
        act,
        (a2,),
        (b2,),
        w,
        *values,
        m,
        w1,
        w2,
        top_k,
        loras,
        torch.ones(loras + 1, device=dev),
        top_k,
        False,
        0,
        False,
        add_inputs=True,
    )
    torch.cuda.synchronize()
    for got, want in ((y13, want13), (y2, want2)):
        err = ((got.double() - want).norm() / (want - want.mean()).norm()).item()
        assert err < 2e-2, err


def test_one_variant_per_configuration_across_token_counts():
    """Token counts of one config bucket (different M classes, different block capacities) reuse one compile."""
    from moelora.kernels import KernelConfig, default_block_m, expand, fused, moe_lora_routing, shrink

    dev, dt, top_k, experts, loras, hidden, n, rank = "cuda", torch.bfloat16, 4, 32, 8, 2880, 5760, 32
    a = torch.zeros(loras, experts, rank, hidden, device=dev, dtype=dt)
    b = torch.zeros(loras, experts, n, rank, device=dev, dtype=dt)
    config = KernelConfig(split_k=4, shrink_block_k=128, expand_block_n=256)

    def run(m: int) -> None:
        ids = torch.randint(0, experts, (m, top_k), device=dev, dtype=torch.int32)
        mapping = torch.arange(m, device=dev, dtype=torch.int32) % loras
        routing = moe_lora_routing(
            topk_ids=ids,
            token_lora_mapping=mapping,
            num_experts=experts,
            max_loras=loras,
            block_m=default_block_m(num_pairs=m * top_k, num_groups=experts * loras),
            method="multi",
        )
        fused.fused_moe_lora(
            output=torch.zeros(m, top_k, n, device=dev, dtype=dt),
            x=torch.zeros(m, hidden, device=dev, dtype=dt),
            lora_a=a,
            lora_b=b,
            routing=routing,
            config=config,
        )

    def variants() -> int:
        return sum(len(c[0]) for c in shrink._shrink_kernel.device_caches.values()) + sum(
            len(c[0]) for c in expand._expand_kernel.device_caches.values()
        )

    run(1024)
    before = variants()
    for m in (1000, 1001, 1017, 1600, 8001, 8006):  # block capacities of every value class
        run(m)
    torch.cuda.synchronize()
    assert variants() == before


@pytest.mark.parametrize("method", ["grouped", "decode"])
def test_after_the_warm_up_serving_compiles_nothing(method, monkeypatch):
    """GPT-OSS-20B's layer through the hooks: the first call warms up; then no token count, in any order, compiles
    another variant of any of our kernels (tests/plugin/test_moe_warmup.py checks the same on the CPU)."""
    from moelora.kernels import expand, onepass, routing, shrink
    from moelora.vllm_plugin import moe_hooks

    monkeypatch.setenv("MOELORA_ROUTING", method)
    monkeypatch.setattr(moe_hooks, "_warmed", set())
    dev, dt, top_k, experts, loras, hidden, inter, rank = "cuda", torch.bfloat16, 4, 32, 8, 2880, 2880, 32
    a13 = torch.zeros(loras, experts, rank, hidden, device=dev, dtype=dt)
    b13 = torch.zeros(loras, experts, 2 * inter, rank, device=dev, dtype=dt)
    a2 = torch.zeros(loras, experts, rank, inter, device=dev, dtype=dt)
    b2 = torch.zeros(loras, experts, hidden, rank, device=dev, dtype=dt)
    punica = SimpleNamespace(
        lora_config=SimpleNamespace(specialize_active_lora=False),
        token_mapping_meta=SimpleNamespace(meta_args=lambda n, spec: (None,) * 5 + (torch.tensor([False]), None)),
    )
    mapping_buffer = torch.zeros(4096, device=dev, dtype=torch.int32)  # vLLM's mapping: a view of one buffer

    def serve(m: int) -> None:
        ids = torch.randint(0, experts, (m, top_k), device=dev, dtype=torch.int32)
        mapping = mapping_buffer[:m]
        mapping.copy_(torch.arange(m, device=dev, dtype=torch.int32) % loras)
        w = torch.rand(m, top_k, device=dev)
        common = {"w1": None, "w2": None, "top_k_num": top_k, "max_loras": loras, "top_k": top_k}
        common |= {"adapter_enabled": torch.ones(loras + 1, device=dev), "fully_sharded": False}
        common |= {"use_tuned_config": False, "add_inputs": True, "num_tokens": m}
        values = moe_hooks.add_lora_w13(
            punica,
            y=torch.zeros(m, top_k, 2 * inter, device=dev, dtype=dt),
            x=torch.zeros(m, hidden, device=dev, dtype=dt),
            lora_a_stacked=(a13,),
            lora_b_stacked=(b13,),
            topk_ids=ids,
            topk_weights=w,
            expert_map=None,
            local_num_experts=experts,
            num_slices=1,
            token_lora_mapping=mapping,
            **common,
        )
        assert values[0] is None  # ours, not vLLM's
        moe_hooks.add_lora_w2(
            punica,
            y=torch.zeros(m, top_k, hidden, device=dev, dtype=dt),
            x=torch.zeros(m * top_k, inter, device=dev, dtype=dt),
            lora_a_stacked=(a2,),
            lora_b_stacked=(b2,),
            topk_weights=w,
            sorted_token_ids_lora=values[0],
            expert_ids_lora=values[1],
            num_tokens_post_padded_lora=values[2],
            token_lora_mapping=values[3],
            tp_rank=0,
            **common,
        )

    kernels = (
        shrink._shrink_kernel,
        expand._expand_kernel,
        onepass._onepass_kernel,
        routing._route_tiny_kernel,
        routing._route_count_kernel,
        routing._route_finish_kernel,
    )

    def variants() -> int:
        return sum(len(c[0]) for k in kernels for c in k.device_caches.values())

    serve(40)  # the first eager call: the warm-up runs inside it
    torch.cuda.synchronize()
    before = variants()
    for m in [*range(1, 80), 128, 129, 255, 256, 257, 300, 511, 777, 1024, 1025, 1600, 2047]:
        serve(m)
    torch.cuda.synchronize()
    assert variants() == before


def _dense_oracle(x, weight, bias, lora_a, lora_b, mapping) -> torch.Tensor:
    """A dense layer with its LoRA in float64: x @ W.T (+ bias), each token's adapter's slices added (id -1: none)."""
    out = x.double() @ weight.double().T + (0.0 if bias is None else bias.double())
    for t, lora in enumerate(mapping.tolist()):
        cols = 0
        for a_s, b_s in zip(lora_a, lora_b, strict=True):
            n = b_s.shape[-2]
            if lora >= 0:
                out[t, cols : cols + n] += (x[t].double() @ a_s[lora, 0].double().T) @ b_s[lora, 0].double().T
            cols += n
    return out


def test_the_lora_stream_fork_without_its_fill_matches_the_oracle_eager_and_replayed(monkeypatch):
    """dense_lora.apply_async on a real second stream, GPT-OSS-20B's q/k/v: 13 tokens scheduled (rows without an
    adapter among them) in a batch padded to 16, as vLLM pads to a captured size. Its LoRA output is never
    zero-filled, so dense_splitk must write every row, the 3 padded ones included, eagerly and when a CUDA graph
    captured with new inputs replays."""
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    from moelora.vllm_plugin import dense_lora

    def not_routed(*args, **kwargs):
        raise AssertionError("the call fell back to vLLM's kernels")

    from vllm.utils.multi_stream_utils import maybe_execute_in_parallel

    monkeypatch.setitem(dense_lora._original, "add_lora_linear", not_routed)
    monkeypatch.setitem(dense_lora._original, "fork", maybe_execute_in_parallel)  # as the install keeps it
    monkeypatch.setattr(dense_lora, "_layers", {})
    dev, dt, m, loras, rank, k, widths = "cuda", torch.bfloat16, 16, 8, 32, 2880, (4096, 512, 512)
    g = torch.Generator(device=dev).manual_seed(0)
    a = tuple((torch.randn(loras, 1, rank, k, generator=g, device=dev) / 16).to(dt) for _ in widths)
    b = tuple((torch.randn(loras, 1, n, rank, generator=g, device=dev) / 16).to(dt) for n in widths)
    weight = (torch.randn(sum(widths), k, generator=g, device=dev) / 64).to(dt)
    mapping = torch.tensor([3, -1, 0, 7, 7, -1, 1, 0, 2, 2, 5, -1, 4], device=dev, dtype=torch.int32)  # 13 of 16
    meta = LoRAKernelMeta.make(loras, 64, device=dev)
    meta.prepare_tensors(mapping)
    layer = SimpleNamespace(
        punica_wrapper=SimpleNamespace(
            token_mapping_meta=meta, lora_config=SimpleNamespace(specialize_active_lora=False)
        ),
        lora_a_stacked=a,
        lora_b_stacked=b,
        output_slices=widths,
        device=torch.device(dev),
        base_layer=None,
        _get_quant_method=lambda: SimpleNamespace(apply=lambda base_layer, x, bias: x @ weight.T),
        _events=[torch.cuda.Event(), torch.cuda.Event()],
        _lora_stream=torch.cuda.Stream(),
    )

    def oracle(x: torch.Tensor) -> torch.Tensor:
        return _dense_oracle(x, weight, None, a, b, mapping)

    x = torch.randn(m, k, generator=g, device=dev).to(dt)
    dense_lora.apply_async(layer, x)  # the first eager call with adapters prepares the layer
    with torch.cuda.stream(layer._lora_stream):  # the allocator reuses a block on the stream that freed it
        garbage = torch.full((m, sum(widths)), float("nan"), device=dev, dtype=dt)
        del garbage  # the LoRA stream's next output of that size likely gets this block, NaN and all
    torch.testing.assert_close(dense_lora.apply_async(layer, x).double(), oracle(x), atol=3e-2, rtol=3e-2)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = dense_lora.apply_async(layer, static_x)
    static_x.copy_(torch.randn(m, k, generator=g, device=dev).to(dt))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out.double(), oracle(static_x), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("widths, bias", [((4096, 512, 512), True), ((2880,), True)], ids=["qkv", "o"])
def test_the_folded_layer_matches_the_oracle_eager_replayed_and_after_a_new_adapter(monkeypatch, widths, bias):
    """dense_fold on GPT-OSS-20B's q/k/v and o (with their biases), bf16: 13 tokens scheduled of a batch padded to
    16, eagerly and replayed from a CUDA graph; then an adapter set into a slot by vLLM's own set_lora after the
    capture, which the replay must read (its lora_a is a view into the folded weight the graph reads)."""
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from moelora.vllm_plugin import dense_fold, dense_lora

    def unreached(*args, **kwargs):
        raise AssertionError("the folded call reached vLLM's fork or kernels")

    monkeypatch.setitem(dense_lora._original, "add_lora_linear", unreached)
    monkeypatch.setitem(dense_lora._original, "fork", unreached)
    monkeypatch.setattr(dense_fold, "_window", [64])
    monkeypatch.setattr(dense_fold, "_folded", {})
    dev, dt, m, loras, rank, k = "cuda", torch.bfloat16, 16, 8, 32, 2880
    g = torch.Generator(device=dev).manual_seed(1)
    n = sum(widths)
    base = SimpleNamespace(
        weight=torch.nn.Parameter((torch.randn(n, k, generator=g, device=dev) / 64).to(dt), requires_grad=False),
        bias=torch.nn.Parameter(torch.randn(n, generator=g, device=dev).to(dt), requires_grad=False) if bias else None,
        quant_method=UnquantizedLinearMethod(),
    )
    mapping = torch.tensor([3, -1, 0, 7, 7, -1, 1, 0, 2, 2, 5, -1, 4], device=dev, dtype=torch.int32)  # 13 of 16
    meta = LoRAKernelMeta.make(loras, 64, device=dev)
    meta.prepare_tensors(mapping)
    layer = SimpleNamespace(
        base_layer=base,
        tp_size=1,
        n_slices=len(widths),
        lora_a_stacked=tuple((torch.randn(loras, 1, rank, k, generator=g, device=dev) / 16).to(dt) for _ in widths),
        lora_b_stacked=tuple((torch.randn(loras, 1, w, rank, generator=g, device=dev) / 16).to(dt) for w in widths),
        output_slices=widths,
        device=torch.device(dev),
        punica_wrapper=SimpleNamespace(
            token_mapping_meta=meta, lora_config=SimpleNamespace(specialize_active_lora=False)
        ),
    )
    layer.reset_lora = lambda index: BaseLinearLayerWithLoRA.reset_lora(layer, index)
    groups = int(meta.default_num_active_loras_cpu.item())
    assert dense_fold.fold_layer(layer, groups) is None

    def oracle(x: torch.Tensor) -> torch.Tensor:
        return _dense_oracle(x, base.weight, base.bias, layer.lora_a_stacked, layer.lora_b_stacked, mapping)

    x = torch.randn(m, k, generator=g, device=dev).to(dt)
    torch.testing.assert_close(dense_lora.apply_async(layer, x, base.bias).double(), oracle(x), atol=3e-2, rtol=3e-2)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = dense_lora.apply_async(layer, static_x, base.bias)
    static_x.copy_(torch.randn(m, k, generator=g, device=dev).to(dt))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out.double(), oracle(static_x), atol=3e-2, rtol=3e-2)
    if len(widths) == 1:  # a new adapter in slot 0, as an adapter's load runs vLLM's set_lora
        new_a = (torch.randn(rank, k, generator=g, device=dev) / 16).to(dt)
        new_b = (torch.randn(n, rank, generator=g, device=dev) / 16).to(dt)
        BaseLinearLayerWithLoRA.set_lora(layer, 0, new_a, new_b)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(layer.lora_a_stacked[0][0, 0], new_a)
        torch.testing.assert_close(static_out.double(), oracle(static_x), atol=3e-2, rtol=3e-2)
