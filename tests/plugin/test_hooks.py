"""The plugin's CUDA extras, exercised on the CPU: the MoE hooks above the op (Triton's interpreter) and the
start-up compile of vLLM's dense LoRA kernels (its plan and its pinned contract)."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest
import torch

from moelora.vllm_plugin import dense_warmup, moe_hooks
from moelora.vllm_plugin.patches import Patches


def _layer(*, m=7, top_k=2, experts=4, loras=3, hidden=32, inter=16, rank=8, slices=2, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*s, scale=1.0):
        return torch.randn(*s, generator=g) * scale

    topk_ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    mapping = torch.randint(-1, loras, (m,), generator=g, dtype=torch.int32)
    mapping[0] = 1  # at least one token with an adapter, one without
    mapping[1] = -1
    w13_n = 2 * inter // slices
    return SimpleNamespace(
        m=m,
        top_k=top_k,
        experts=experts,
        loras=loras,
        hidden=hidden,
        inter=inter,
        slices=slices,
        x=rnd(m, hidden),
        topk_ids=topk_ids,
        topk_w=torch.rand(m, top_k, generator=g),
        mapping=mapping,
        a13=tuple(rnd(loras, experts, rank, hidden, scale=0.3) for _ in range(slices)),
        b13=tuple(rnd(loras, experts, w13_n, rank, scale=0.3) for _ in range(slices)),
        a2=(rnd(loras, experts, rank, inter, scale=0.3),),
        b2=(rnd(loras, experts, hidden, rank, scale=0.3),),
        y13=rnd(m, top_k, 2 * inter),
        act=rnd(m * top_k, inter),
        y2=rnd(m, top_k, hidden),
        w1=torch.empty(experts, 2 * inter, hidden),
        w2=torch.empty(experts, hidden, inter),
    )


def _punica(no_lora=False):
    """What the hooks read of vLLM's PunicaWrapperGPU: its token-mapping metadata (meta_args()[5] is the CPU
    "no adapter in this batch" flag)."""
    flag = torch.tensor([no_lora])
    return SimpleNamespace(
        lora_config=SimpleNamespace(specialize_active_lora=False),
        token_mapping_meta=SimpleNamespace(meta_args=lambda n, spec: (None,) * 5 + (flag, None)),
    )


def _w13(layer, wrapper=None, **overrides):
    args = {
        "y": layer.y13,
        "x": layer.x,
        "lora_a_stacked": layer.a13,
        "lora_b_stacked": layer.b13,
        "topk_ids": layer.topk_ids,
        "topk_weights": layer.topk_w,
        "expert_map": None,
        "w1": layer.w1,
        "w2": layer.w2,
        "num_tokens": layer.m,
        "top_k_num": layer.top_k,
        "max_loras": layer.loras,
        "adapter_enabled": torch.ones(layer.loras + 1),
        "local_num_experts": layer.experts,
        "top_k": layer.top_k,
        "num_slices": layer.slices,
        "fully_sharded": False,
        "use_tuned_config": False,
        "add_inputs": True,
        "token_lora_mapping": layer.mapping,
    }
    return moe_hooks.add_lora_w13(wrapper or _punica(), **(args | overrides))


def _w2(layer, routing_values, wrapper=None, **overrides):
    sorted_ids, expert_ids, npad, mapping = routing_values
    args = {
        "y": layer.y2,
        "x": layer.act,
        "lora_a_stacked": layer.a2,
        "lora_b_stacked": layer.b2,
        "topk_weights": layer.topk_w,
        "sorted_token_ids_lora": sorted_ids,
        "expert_ids_lora": expert_ids,
        "num_tokens_post_padded_lora": npad,
        "token_lora_mapping": mapping,
        "num_tokens": layer.m,
        "w1": layer.w1,
        "w2": layer.w2,
        "top_k_num": layer.top_k,
        "max_loras": layer.loras,
        "adapter_enabled": torch.ones(layer.loras + 1),
        "top_k": layer.top_k,
        "fully_sharded": False,
        "tp_rank": 0,
        "use_tuned_config": False,
        "add_inputs": True,
    }
    return moe_hooks.add_lora_w2(wrapper or _punica(), **(args | overrides))


@pytest.mark.parametrize("slices", [1, 2])
def test_w13_then_w2_match_the_oracle(slices, naive):
    layer = _layer(slices=slices)
    want13 = torch.cat(
        [
            naive(
                output=layer.y13.view(layer.m, layer.top_k, -1)[
                    :, :, i * (2 * layer.inter // slices) : (i + 1) * (2 * layer.inter // slices)
                ],
                x=layer.x,
                lora_a=a,
                lora_b=b,
                topk_ids=layer.topk_ids,
                token_lora_mapping=layer.mapping,
                topk_weights=layer.topk_w,
                mul_routed_weight=False,
            )
            for i, (a, b) in enumerate(zip(layer.a13, layer.b13))
        ],
        dim=-1,
    )
    want2 = naive(
        output=layer.y2,
        x=layer.act.view(layer.m, layer.top_k, -1),
        lora_a=layer.a2[0],
        lora_b=layer.b2[0],
        topk_ids=layer.topk_ids,
        token_lora_mapping=layer.mapping,
        topk_weights=layer.topk_w,
        mul_routed_weight=True,
    )
    values = _w13(layer)
    # vLLM only carries the four values over to the layer's w2 call: ours say "no blocked layout"
    assert values[:3] == (None, None, None) and torch.equal(values[3], layer.mapping)
    _w2(layer, values)
    torch.testing.assert_close(layer.y13.double(), want13, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer.y2.double(), want2, rtol=1e-4, atol=1e-4)
    assert moe_hooks._kept.routing is None  # consumed: a stray w2 call cannot reuse it


@pytest.mark.parametrize("slices", [1, 2])
def test_w13_is_one_op_whatever_its_slices(slices, monkeypatch):
    # Qwen3-MoE's gate and up slices go through one op: one shrink and one expand launch, not one op per slice.
    from moelora.kernels import fused
    from moelora.vllm_plugin import triton_path

    ops, shrinks = [], []
    op, shrink = triton_path.fused_moe_lora, fused.launch_shrink
    monkeypatch.setattr(triton_path, "fused_moe_lora", lambda **kw: ops.append(len(kw["lora_a"])) or op(**kw))
    monkeypatch.setattr(fused, "launch_shrink", lambda plan: shrinks.append(plan.slices) or shrink(plan))
    _w13(_layer(slices=slices))
    assert ops == [slices] and shrinks == [slices]


def test_add_inputs_false_adds_into_vllms_zeroed_buffer_without_a_fill_of_its_own(naive):
    """vLLM's experts pass add_inputs=False with a delta buffer they zeroed (triton_moe.py: torch.zeros_like before the
    LoRA stream forks): the hook writes the delta into it and launches no second fill, so rows of tokens without an
    adapter keep what the caller put there."""
    layer = _layer(slices=1)
    layer.y13.zero_()
    no_adapter = layer.mapping < 0
    layer.y13.view(layer.m, layer.top_k, -1)[no_adapter] = 123.0
    _w13(layer, add_inputs=False)
    want = naive(
        output=torch.zeros_like(layer.y13),
        x=layer.x,
        lora_a=layer.a13[0],
        lora_b=layer.b13[0],
        topk_ids=layer.topk_ids,
        token_lora_mapping=layer.mapping,
        topk_weights=layer.topk_w,
        mul_routed_weight=False,
    )
    got = layer.y13.double().view(layer.m, layer.top_k, -1)
    want = want.view(layer.m, layer.top_k, -1)
    torch.testing.assert_close(got[~no_adapter], want[~no_adapter], rtol=1e-4, atol=1e-4)
    assert bool((got[no_adapter] == 123.0).all())


def test_a_batch_without_adapters_gets_nothing_added(monkeypatch):
    """vLLM does not refresh the token map for such a batch (it keeps an earlier batch's slots): read it and the
    base model's requests would get an adapter's delta. As vLLM, add nothing; the w2 call is vLLM's, which returns
    on the same flag."""
    calls = []
    monkeypatch.setitem(moe_hooks._originals, "add_lora_w2", lambda *a, **k: calls.append("w2"))
    layer = _layer()
    before13, before2 = layer.y13.clone(), layer.y2.clone()
    values = _w13(layer, wrapper=_punica(no_lora=True))  # layer.mapping still names adapters: stale
    assert values[:3] == (None, None, None)
    _w2(layer, values, wrapper=_punica(no_lora=True))
    assert torch.equal(layer.y13, before13) and torch.equal(layer.y2, before2) and calls == ["w2"]


def test_unsupported_and_foreign_calls_go_to_vllm(monkeypatch):
    calls = []
    monkeypatch.setitem(
        moe_hooks._originals, "add_lora_w13", lambda *a, **k: calls.append("w13") or ("s", "e", "n", "m")
    )
    monkeypatch.setitem(moe_hooks._originals, "add_lora_w2", lambda *a, **k: calls.append("w2"))
    layer = _layer()
    before = layer.y13.clone()
    values = _w13(layer, expert_map=torch.arange(layer.experts))
    assert calls == ["w13"] and values == ("s", "e", "n", "m") and torch.equal(layer.y13, before)
    # a w2 call carrying vLLM's blocked layout (its own w13 ran) is vLLM's too
    _w2(layer, (torch.zeros(1), torch.zeros(1), torch.zeros(1), layer.mapping))
    assert calls == ["w13", "w2"]
    _w13(layer, fully_sharded=True)
    assert calls == ["w13", "w2", "w13"]


def test_hooks_install_on_vllms_punica_wrapper_and_come_off():
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    before = (PunicaWrapperGPU.add_lora_w13, PunicaWrapperGPU.add_lora_w2)
    patches = Patches()
    assert moe_hooks.install_moe_hooks(PunicaWrapperGPU, patches) is None  # the installed vLLM has the pinned ones
    try:
        assert PunicaWrapperGPU.add_lora_w13 is moe_hooks.add_lora_w13
        assert PunicaWrapperGPU.add_lora_w2 is moe_hooks.add_lora_w2
        assert [(p.owner, p.name, p.original) for p in patches.done[:2]] == [
            (PunicaWrapperGPU, "add_lora_w13", before[0]),
            (PunicaWrapperGPU, "add_lora_w2", before[1]),
        ]
    finally:
        patches.undo()
    assert (PunicaWrapperGPU.add_lora_w13, PunicaWrapperGPU.add_lora_w2) == before
    assert not moe_hooks._originals


def test_hooks_refuse_a_changed_signature():
    class Changed:
        def add_lora_w13(self, y, x, lora_a_stacked, lora_b_stacked, topk_ids):  # not vLLM's
            return "kept"

        def add_lora_w2(self, *args):
            return "kept"

    patches = Patches()
    assert "signature differs" in moe_hooks.install_moe_hooks(Changed, patches)
    assert not patches.done
    assert Changed().add_lora_w13(1, 2, 3, 4, 5) == "kept"


def test_dense_warmup_covers_every_bucket_and_m_class():
    ms = dense_warmup.warm_ms({1, 16, 24, 1024, 8192}, cap=8192)
    for k in (1, 16, 24, 1024, 8192, 128):  # the file's buckets and vLLM's default switch
        assert k in ms
    assert 2 in ms and 17 in ms and 1025 in ms and 129 in ms  # the other M class next to each bucket
    assert max(ms) == 8192 and ms == sorted(set(ms))
    assert dense_warmup.warm_ms({4096}, cap=1000) == [1, 2, 128, 129]
    assert 65536 not in dense_warmup.warm_ms({65536})  # bounded scratch buffers


def _config_and_class(keys: set[int], m: int) -> tuple[int, int]:
    """What picks a compiled variant of vLLM's dense LoRA kernels at m tokens: the nearest bucket's configuration
    (vLLM's get_lora_op_configs) and Triton's class of the integer (1, a multiple of 16, other)."""
    return min(keys, key=lambda k: abs(k - m)), 1 if m == 1 else 16 if m % 16 == 0 else 0


@pytest.mark.parametrize("bound", [1024, 1000, 1023, 64, 0, 100_000])
def test_dense_warmup_split_at_the_bound_loses_no_variant(bound, monkeypatch, fresh_bound):
    """A call warms its own side of lora_stream's bound (the second stream below, in place above: different
    epilogues): every token count on that side whose variant the whole warm-up covers meets one warmed there."""
    from moelora.vllm_plugin import lora_stream

    monkeypatch.setenv(lora_stream.ENV, str(bound))
    buckets, cap = {1, 16, 64, 128, 256, 1024, 4096, 8192}, 8192
    ms = dense_warmup.warm_ms(buckets, cap=cap)
    keys = buckets | {1, 128}
    whole = {_config_and_class(keys, n) for n in ms}
    for side_m in (1, bound, bound + 1, cap):
        if not 1 <= side_m <= cap:
            continue
        warmed = dense_warmup.side_ms(ms, side_m, cap)
        above = lora_stream.in_place(side_m)
        assert warmed and all(lora_stream.in_place(n) == above and n <= cap for n in warmed)
        have = {_config_and_class(keys, n) for n in warmed}
        side = [m for m in range(1, cap + 1) if lora_stream.in_place(m) == above]
        missing = [m for m in side if _config_and_class(keys, m) in whole - have]
        assert not missing, missing[:5]
    if 64 < bound < cap:  # the sides split the warm-up: neither warms the other's buckets
        assert 8192 not in dense_warmup.side_ms(ms, 1, cap) and 1 not in dense_warmup.side_ms(ms, cap, cap)


def test_the_adding_expand_warms_its_side_of_the_bound_and_the_writing_one_every_bucket(monkeypatch, fresh_bound):
    """vLLM's lora_expand through the wrapper: an adding call above lora_stream's bound (the LoRA added in place)
    runs the op at that side's token counts only, the first adding call below it runs the rest, and a second call
    on a side runs nothing more; the writing expand (the second stream's) warms every bucket at its first call."""
    from moelora.vllm_plugin import lora_stream

    monkeypatch.setenv(lora_stream.ENV, "1024")
    ran: list[int] = []
    warmed: set = set()

    def should_warm(key, inputs, no_lora_flag_cpu):  # _should_warm without its CUDA-only conditions
        return key not in warmed and not warmed.add(key)

    monkeypatch.setattr(dense_warmup, "_should_warm", should_warm)
    monkeypatch.setattr(dense_warmup, "_file_ms", lambda op, add: {16, 1024, 4096})
    monkeypatch.setattr(dense_warmup, "_meta", lambda loras, m, dev: (None,) * 9)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    expand = dense_warmup.make_expand(lambda inputs, *args, **kwargs: ran.append(inputs.size(1)))
    b = (torch.zeros(3, 1, 40, 8),)
    mapping = torch.zeros(8192, dtype=torch.int32)

    def call(m: int, add: bool) -> list[int]:
        ran.clear()
        inputs = torch.zeros(1, m, 8)
        expand(inputs, b, torch.zeros(m, 40), mapping[:m], None, None, None, torch.zeros(4), None, None, 0, add)
        return ran[:-1]  # the warm-up's runs, without the call itself

    above = call(2000, True)
    assert above and all(m > 1024 for m in above) and 4096 in above and 1040 in above
    below = call(100, True)
    assert below and all(m <= 1024 for m in below) and {1, 16, 17, 1024, 1023} <= set(below)
    assert call(3000, True) == [] and call(50, True) == []
    assert set(call(100, False)) == set(dense_warmup.warm_ms({16, 1024, 4096}, cap=8192))
    assert call(2000, False) == []


def test_dense_warmup_contract_matches_the_installed_vllm():
    registered = {}
    assert dense_warmup.install_dense_warmup(lambda name, fn: registered.__setitem__(name, fn)) is None
    assert sorted(registered) == ["lora_expand", "lora_shrink"]
    assert registered["lora_shrink"].__qualname__ == "moelora_warm_lora_shrink"


def test_compile_log_hook_logs_and_returns_none(monkeypatch, plugin_log):
    import triton

    import moelora.vllm_plugin as plugin

    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.setenv(plugin.COMPILE_LOG_ENV, "1")
    monkeypatch.setenv(plugin.ENV, "")  # only the diagnostic, no kernel swap
    plugin.register()
    hook = triton.knobs.runtime.jit_post_compile_hook
    assert hook is not None
    assert hook(repr="_shrink_kernel[num_warps=4](M: i32)") is None  # a truthy return would mean "skip" to Triton
    assert any("Triton compiled _shrink_kernel" in line for line in plugin_log)


def test_model_warmup_counts_cover_every_class_above_the_graph_sizes():
    from moelora.vllm_plugin.model_warmup import ANCHORS, warm_token_counts

    counts = warm_token_counts(8192, graph_max=32)
    assert min(counts) > 32 and max(counts) == 8192 and counts == sorted(set(counts))
    classes = {(m % 16 == 0, (m * 4) % 16 == 0, (m * 8) % 16 == 0) for m in counts}
    assert classes == {(True, True, True), (False, False, False), (False, False, True), (False, True, True)}
    for anchor in ANCHORS[1:]:  # every configuration boundary, with its neighbours of the other classes
        assert {anchor, anchor + 1, anchor + 2, anchor + 4} & set(counts) >= {anchor}
    assert warm_token_counts(2048, graph_max=512)[0] > 512 and max(warm_token_counts(2048, 512)) <= 2048


class _Runner:
    """vLLM's V1 model runner as the warm-up sees it; `events`: dummy passes, logits and LoRA removal, in order."""

    def __init__(self, fail_at=None, max_num_seqs=64):
        self.calls, self.removed, self.fail_at, self.events = [], 0, fail_at, []
        self.lora_config = SimpleNamespace(max_loras=8)
        self.max_num_seqs = max_num_seqs
        runner = self

        class Model:
            def compute_logits(self, hidden_states):
                runner.events.append(("logits", tuple(hidden_states.shape), torch.is_inference_mode_enabled()))
                return hidden_states

        self.model = Model()

    def _dummy_run(
        self, num_tokens, cudagraph_runtime_mode=None, skip_eplb=False, remove_lora=True, num_active_loras=0
    ):  # the parameters vLLM 0.26 and 0.32 share
        if num_tokens == self.fail_at:
            raise RuntimeError("boom")
        self.calls.append(
            (num_tokens, {"skip_eplb": skip_eplb, "remove_lora": remove_lora, "num_active_loras": num_active_loras})
        )
        self.events.append(("pass", num_tokens))
        hidden = torch.full((num_tokens, 4), float("nan"))  # dummy states may hold anything
        return hidden, hidden[: min(num_tokens, self.max_num_seqs)]  # one sampled row per dummy request

    def maybe_remove_all_loras(self, lora_config):
        self.removed += 1
        self.events.append(("removed",))


def _worker(runner, eager=False, mode="FULL_AND_PIECEWISE"):
    return SimpleNamespace(
        model_runner=runner,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=8192),
        vllm_config=SimpleNamespace(
            compilation_config=SimpleNamespace(
                cudagraph_capture_sizes=[1, 2, 4, 8, 16, 24, 32], cudagraph_mode=SimpleNamespace(name=mode)
            )
        ),
        model_config=SimpleNamespace(enforce_eager=eager),
    )


def test_model_warmup_runs_vllms_dummy_pass_with_every_lora_slot_then_cleans_up(plugin_log):
    from moelora.vllm_plugin.model_warmup import warm_model, warm_token_counts

    runner = _Runner()
    warm_model(_worker(runner))
    assert [m for m, _ in runner.calls] == list(reversed(warm_token_counts(8192, 32)))
    assert all(kw == {"skip_eplb": True, "remove_lora": False, "num_active_loras": 8} for _, kw in runner.calls)
    assert runner.removed == 1 and any("model warm-up ran" in line for line in plugin_log)
    eager = _Runner()
    warm_model(_worker(eager, eager=True))  # nothing captured: the small counts run too
    assert min(m for m, _ in eager.calls) == 32
    decode_only = _Runner()
    warm_model(_worker(decode_only, mode="FULL_DECODE_ONLY"))  # prefills of <= 32 tokens run eagerly, unpadded
    assert min(m for m, _ in decode_only.calls) == 32


def test_model_warmup_computes_logits_once_with_the_adapters_still_active(plugin_log):
    """An adapter on lm_head runs LoRA kernels only in compute_logits, which the dummy passes never reach: the
    warm-up computes logits once on the last pass's sampled rows, after every pass and before the dummy adapters
    are removed (their mapping is the last pass's), so vLLM's lm_head shrink/expand compile at start-up."""
    from moelora.vllm_plugin.model_warmup import warm_model, warm_token_counts

    runner = _Runner()
    warm_model(_worker(runner))
    smallest = warm_token_counts(8192, 32)[0]
    rows = min(smallest, runner.max_num_seqs)  # one sampled row per dummy request
    assert runner.events[-3:] == [("pass", smallest), ("logits", (rows, 4), True), ("removed",)]
    assert [e for e in runner.events if e[0] == "logits"] == [("logits", (rows, 4), True)]  # once, not per pass
    assert any(f"logits computed for {rows} rows" in line for line in plugin_log)
    no_lora = _Runner()
    no_lora.lora_config = None  # without LoRA vLLM's own sampler warm-up covers the logits
    warm_model(_worker(no_lora))
    assert not [e for e in no_lora.events if e[0] == "logits"] and no_lora.calls


def _hashed(worker, vllm_hash="server A"):
    """A worker whose vLLM config hash (the one naming vLLM's torch.compile cache) is `vllm_hash`."""
    worker.vllm_config.compute_hash = lambda: vllm_hash
    return worker


def test_model_warmup_runs_once_per_compile_cache(plugin_log, monkeypatch, tmp_path):
    """A finished warm-up marks Triton's cache, and a second pod of the same server on that cache runs only the
    largest count's pass and the logits (loading what the first prompts would); another server, MOELORA_WARMUP=always,
    several ranks or a warm-up that failed half-way mean every pass runs."""
    from moelora.vllm_plugin import model_warmup
    from moelora.vllm_plugin.model_warmup import warm_model
    from moelora.vllm_plugin.warm_marker import MARKER_DIR

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    first, second = _Runner(), _Runner()
    warm_model(_hashed(_worker(first)))
    assert first.calls and first.removed == 1 and len(list((tmp_path / MARKER_DIR).iterdir())) == 1
    warm_model(_hashed(_worker(second)))
    largest = max(m for m, _ in first.calls)
    assert [m for m, _ in second.calls] == [largest] and len(first.calls) > 1
    assert second.calls[0][1] == {"skip_eplb": True, "remove_lora": False, "num_active_loras": 8}
    rows = min(largest, second.max_num_seqs)
    assert second.events == [("pass", largest), ("logits", (rows, 4), True), ("removed",)]
    assert any(
        "model warm-up skipped: Triton's cache was warmed" in line and f"one pass of {largest} tokens" in line
        for line in plugin_log
    )
    other = _Runner()
    warm_model(_hashed(_worker(other), "server B"))
    assert other.calls
    monkeypatch.setenv("MOELORA_WARMUP", "always")
    forced = _Runner()
    warm_model(_hashed(_worker(forced)))
    assert forced.calls
    monkeypatch.delenv("MOELORA_WARMUP")
    monkeypatch.setattr(model_warmup, "_world_size", lambda: 2)
    ranked = _Runner()
    warm_model(_hashed(_worker(ranked)))
    assert ranked.calls
    monkeypatch.setattr(model_warmup, "_world_size", lambda: 1)
    failed, after = _Runner(fail_at=4096), _Runner()
    warm_model(_hashed(_worker(failed), "server C"))
    warm_model(_hashed(_worker(after), "server C"))
    assert after.calls and after.calls[0][0] > 4096


def test_the_warm_up_marker_follows_what_picks_the_kernels_and_survives_a_read_only_cache(
    plugin_log, monkeypatch, tmp_path
):
    """The marker's name changes with the tuned-config folder's files, the token counts and the MOELORA_ switches
    that can pick a kernel variant, not with those that only diagnose or act on the host;
    a cache that cannot be written leaves the warm-up to run (and say so), never fails it."""
    from moelora.vllm_plugin import warm_marker
    from moelora.vllm_plugin.model_warmup import warm_model

    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / "E=32.json").write_text('{"16": {"BLOCK_SIZE_M": 16}}')
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tuned))
    worker = _hashed(_worker(_Runner()))
    name = warm_marker.digest(worker, [65, 96], 8)
    assert name == warm_marker.digest(worker, [65, 96], 8)
    assert warm_marker.digest(worker, [65, 96, 128], 8) != name
    (tuned / "E=32.json").write_text('{"16": {"BLOCK_SIZE_M": 32}}')
    assert warm_marker.digest(worker, [65, 96], 8) != name
    name = warm_marker.digest(worker, [65, 96], 8)
    monkeypatch.setenv("MOELORA_PROFILE_STARTUP", str(tmp_path / "profile"))  # a diagnostic picks no kernel
    monkeypatch.setenv("MOELORA_ADAPTERS_AHEAD_DIR", str(tmp_path / "adapters"))
    assert warm_marker.digest(worker, [65, 96], 8) == name
    plugin = pathlib.Path(warm_marker.__file__).parent
    source = "".join(path.read_text() for path in plugin.glob("*.py") if path.name != "warm_marker.py")
    assert all(f'"{switch}"' in source for switch in warm_marker.HOST_SWITCHES)  # each one a switch the plugin reads
    monkeypatch.setenv("MOELORA_ROUTING", "decode")
    assert warm_marker.digest(worker, [65, 96], 8) not in (name, None)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocker))
    runner = _Runner()
    warm_model(_hashed(_worker(runner)))
    assert runner.calls and runner.removed == 1
    assert any("warm-up marker not written" in line for line in plugin_log)


def test_model_warmup_never_stops_the_server(plugin_log, monkeypatch):
    from moelora.vllm_plugin.model_warmup import warm_model

    runner = _Runner(fail_at=4096)
    warm_model(_worker(runner))
    assert runner.removed == 1 and any("warm-up stopped" in line for line in plugin_log)
    monkeypatch.setenv("MOELORA_WARMUP", "0")
    quiet = _Runner()
    warm_model(_worker(quiet))
    assert quiet.calls == [] and quiet.removed == 0


def test_model_warmup_wraps_vllms_kernel_warmup_and_comes_off(monkeypatch):
    from vllm.model_executor.warmup import kernel_warmup as warmup_module
    from vllm.v1.worker import gpu_worker

    from moelora.vllm_plugin import model_warmup

    seen = []

    def vllms(worker, **kw):
        seen.append(("vllm", kw))

    monkeypatch.setattr(warmup_module, "kernel_warmup", vllms)
    monkeypatch.setattr(gpu_worker, "kernel_warmup", vllms)  # as bound by the worker module's own import
    monkeypatch.setattr(model_warmup, "warm_model", lambda worker: seen.append(("ours", worker)))
    patches = Patches()
    assert model_warmup.install_model_warmup(patches) is None  # the installed vLLM (0.32) has what it pins
    try:
        assert warmup_module.kernel_warmup is gpu_worker.kernel_warmup  # both names wrapped
        gpu_worker.kernel_warmup("w", process_local_only=True)
        assert seen == [("ours", "w"), ("vllm", {"process_local_only": True})]  # ours first, vLLM's untouched
    finally:
        patches.undo()
    assert warmup_module.kernel_warmup is vllms and gpu_worker.kernel_warmup is vllms


def test_model_warmup_skips_a_runner_without_the_pinned_dummy_run(plugin_log):
    from moelora.vllm_plugin.model_warmup import warm_model

    class Old(_Runner):
        def _dummy_run(self, num_tokens, skip_eplb=False, remove_lora=True):  # no num_active_loras
            self.calls.append(num_tokens)

    runner = Old()
    warm_model(_worker(runner))
    assert runner.calls == [] and any("num_active_loras" in line for line in plugin_log)


def test_model_warmup_skips_the_v2_model_runner(plugin_log):
    """vLLM 0.32 and 0.33 pick the V2 model runner for MoE models by default (0.26 did not for GPT-OSS or Qwen3-MoE);
    its `_dummy_run` takes the token count but no LoRA parameters (it swallows unknown keywords), so the warm-up,
    which needs every LoRA slot active, must not run it."""
    from moelora.vllm_plugin.model_warmup import warm_model

    class V2Runner(_Runner):
        def _dummy_run(self, num_tokens, *args, skip_attn=True, uniform_decode=False, skip_eplb=False, **kwargs):
            self.calls.append(num_tokens)

    runner = V2Runner()
    worker = _worker(runner)
    worker.use_v2_model_runner = True
    warm_model(worker)
    assert runner.calls == [] and runner.removed == 0
    assert any("model warm-up skipped (not vLLM's V1 GPU model runner)" in line for line in plugin_log)
    v1 = _Runner()
    worker = _worker(v1)
    worker.use_v2_model_runner = False  # VLLM_USE_V2_MODEL_RUNNER=0 keeps V1, and the warm-up runs
    warm_model(worker)
    assert v1.calls and v1.removed == 1


def test_model_warmup_needs_a_kernel_warmup_that_takes_the_worker(monkeypatch):
    from vllm.model_executor.warmup import kernel_warmup as warmup_module

    from moelora.vllm_plugin import model_warmup

    def renamed(runner, process_local_only=False):
        raise AssertionError("never called")

    monkeypatch.setattr(warmup_module, "kernel_warmup", renamed)
    patches = Patches()
    assert model_warmup.install_model_warmup(patches) == "vLLM's kernel_warmup takes no worker"
    assert warmup_module.kernel_warmup is renamed and patches.done == []


def test_dense_warmup_waits_for_a_batch_with_adapters_and_caps_its_scratch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    x = SimpleNamespace(device=torch.device("cuda"))  # only its device is looked at
    key = ("shrink", "test-key")
    dense_warmup._warmed.discard(key)
    assert not dense_warmup._should_warm(key, x, torch.tensor([True]))  # no adapter: e.g. vLLM's profile run
    assert key not in dense_warmup._warmed  # not marked: the next call with adapters warms
    assert dense_warmup._should_warm(key, x, torch.tensor([False]))
    assert not dense_warmup._should_warm(key, x, torch.tensor([False]))  # once per key
    dense_warmup._warmed.discard(key)
    buffer = torch.zeros(8192, dtype=torch.int32)  # vLLM's metadata buffer, max_num_batched_tokens long
    assert dense_warmup._cap(buffer[:100], row_bytes=16) == 8192  # a view: the buffer's capacity counts
    assert dense_warmup._cap(buffer, row_bytes=201_088 * 2) == dense_warmup.MAX_SCRATCH_BYTES // (201_088 * 2)


def test_served_routing_is_grouped_unless_the_environment_says_otherwise(monkeypatch):
    # 4 tokens x top-2 over 2 adapters x 8 experts: few enough pairs that the library's `auto` goes direct.
    from moelora.vllm_plugin import triton_path

    args = {
        "topk_ids": torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=torch.int32),
        "token_lora_mapping": torch.tensor([0, 1, 0, -1]),
        "num_experts": 8,
        "max_loras": 2,
    }
    monkeypatch.delenv("MOELORA_ROUTING", raising=False)
    assert not triton_path.route(**args).direct
    monkeypatch.setenv("MOELORA_ROUTING", "auto")
    assert triton_path.route(**args).direct
