"""An experiment, not served: how much would the MoE-LoRA's expand cost folded into the base fused-MoE GEMM?

The served layer runs the base gate_up GEMM (vLLM's fused_moe kernel) and our LoRA op (shrink, then an expand that
reads and writes the GEMM's output again) as separate kernels, beside each other on two streams at decode sizes and
one after the other above them. Folded, the GEMM's epilogue would add each row's (x @ A) @ B before its one store:
the output's second read and write and the expand's launch go away, and the B tiles are read by the CTAs that
already own those columns. Qwen3-MoE's small experts make that output traffic large against its weights: the reason
to measure it before building it into the plugin.

The probe has its own base GEMM (pairs sorted by expert into row blocks, as vLLM's moe_align_block_size lays them
out, and within an expert by adapter, so a prefill block sees few adapters), with FOLD off and on, and times:
    base      the GEMM alone
    +op       the GEMM, then our routing and served gate_up op (the plugin's path above the two-stream bound)
    folded    the GEMM with the expand in its epilogue, reading each pair's rank-r shrink from a buffer
    +shrink   folded, after our routing and served shrink (which writes split-K partials in its own block order,
              not the per-pair rows folded reads: the bytes are the same, the layout would need a change)
    vLLM      vLLM's own fused-MoE GEMM on the same inputs with the config it would serve (its table, else its
              default), where vLLM imports (the probe's GEMM has to be as fast as it for a fold to pay)

    python -m moelora.kernels.tools.moe_fold_probe                 # both models, M = 16, 64, 1600, 8192
    python -m moelora.kernels.tools.moe_fold_probe --models qwen3 --m 16,1600

Times are CUDA-graph replay medians over calls cycling through input sets whose LoRA weights exceed the L2 (as
tools.bench does), so the adapters come from HBM.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moelora.kernels import fused_moe_lora, plan_op
from moelora.kernels.tools.bench import (
    MODELS,
    W13_SLICES,
    default_layer_config,
    layer_routing,
    make_inputs,
    time_graph,
)


@triton.jit
def _moe_gemm(
    x_ptr,  # (M, K) bf16
    w_ptr,  # (E, N, K) bf16: vLLM's w13 layout
    out_ptr,  # (M * TOPK, N) bf16
    sorted_ptr,  # (blocks * BLOCK_M,) int32 pair index, num_pairs where padded
    block_expert_ptr,  # (blocks,) int32
    s_ptr,  # (M * TOPK, SLICES, RANK) bf16: each pair's shrink, x @ A[lora, e].T per slice
    b_ptr,  # (SLICES, LORAS, E, N // SLICES, RANK) bf16
    lora_ptr,  # (M,) int32, -1 without an adapter
    num_pairs,
    K: tl.constexpr,
    N: tl.constexpr,
    TOPK: tl.constexpr,
    E: tl.constexpr,
    LORAS: tl.constexpr,
    RANK: tl.constexpr,
    SLICES: tl.constexpr,
    FOLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = rows < num_pairs
    token = tl.where(valid, rows // TOPK, 0)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + token[:, None].to(tl.int64) * K + ks[None, :]
    w_ptrs = w_ptr + expert * N * K + cols[None, :].to(tl.int64) * K + ks[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K // BLOCK_K):
        a = tl.load(x_ptrs, mask=valid[:, None], other=0.0)
        b = tl.load(w_ptrs)
        acc += tl.dot(a, b)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if FOLD:
        slice_n: tl.constexpr = N // SLICES
        part = (pid_n * BLOCK_N) // slice_n  # a column tile lies in one slice (BLOCK_N divides N / SLICES)
        local = cols - part * slice_n
        lora = tl.load(lora_ptr + token, mask=valid, other=-1)
        rk = tl.arange(0, RANK)
        s = tl.load(s_ptr + (rows[:, None].to(tl.int64) * SLICES + part) * RANK + rk[None, :], mask=valid[:, None])
        for slot in range(LORAS):
            mine = lora == slot
            # Rows sorted by adapter within an expert: a decode block holds one or two adapters, so most slots
            # skip their B tile.
            if tl.max(mine.to(tl.int32)) > 0:
                base = ((part * LORAS + slot) * E + expert) * slice_n * RANK
                bt = tl.load(b_ptr + base + local[None, :].to(tl.int64) * RANK + rk[:, None])
                acc += tl.dot(tl.where(mine[:, None], s, tl.zeros_like(s)), bt)
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None])


def align(topk_ids: torch.Tensor, lora_map: torch.Tensor, num_experts: int, block_m: int):
    """Pairs sorted by (expert, adapter) into row blocks of one expert each, padded with num_pairs: vLLM's
    moe_align_block_size's layout, with the adapter as the second key. Returns (sorted ids, each block's expert)."""
    m, top_k = topk_ids.shape
    pairs = m * top_k
    expert = topk_ids.reshape(-1).long()
    lora = lora_map.long().repeat_interleave(top_k)
    order = torch.argsort(expert * (int(lora.max()) + 2) + lora + 1, stable=True)
    counts = torch.bincount(expert, minlength=num_experts)
    blocks = (counts + block_m - 1) // block_m
    starts = torch.cumsum(counts, 0) - counts
    block_starts = torch.cumsum(blocks, 0) - blocks
    sorted_ids = torch.full((int(blocks.sum()) * block_m,), pairs, dtype=torch.int32, device=topk_ids.device)
    rank_in_expert = torch.arange(pairs, device=topk_ids.device) - starts[expert[order]]
    sorted_ids[block_starts[expert[order]] * block_m + rank_in_expert] = order.to(torch.int32)
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=topk_ids.device), blocks)
    return sorted_ids, block_expert.to(torch.int32)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def moe_gemm(x, w, out, sorted_ids, block_expert, *, top_k, cfg: GemmConfig, fold=None) -> None:
    """out[pair] = x[token] @ w[expert].T for every routed pair; with fold=(s, lora_b, lora_map), plus each pair's
    s @ B[lora, expert].T on its slice's columns."""
    e, n, k = w.shape
    if fold is None:  # the LoRA arguments are never read with FOLD off: any pointers do
        s, lora_b, lora_map, slices, loras, rank = out, out, sorted_ids, 1, 1, 16
    else:
        s, lora_b, lora_map = fold
        slices, loras, _, _, rank = lora_b.shape
    assert k % cfg.block_k == 0 and (n // slices) % cfg.block_n == 0
    grid = (block_expert.numel(), n // cfg.block_n)
    _moe_gemm[grid](
        x, w, out, sorted_ids, block_expert, s, lora_b, lora_map, out.shape[0],
        K=k, N=n, TOPK=top_k, E=e, LORAS=loras, RANK=rank, SLICES=slices, FOLD=fold is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def reference(x, w, topk_ids, fold=None, pairs=None) -> torch.Tensor:
    """What moe_gemm computes for the given pairs (default all), in float32 with PyTorch, 32 pairs at a time."""
    top_k = topk_ids.shape[1]
    pairs = torch.arange(topk_ids.numel(), device=x.device) if pairs is None else pairs
    rows = []
    for chunk in pairs.split(32):
        tok, experts = chunk // top_k, topk_ids.reshape(-1)[chunk].long()
        out = torch.einsum("pk,pnk->pn", x[tok].float(), w[experts].float())
        if fold is not None:
            s, lora_b, lora_map = fold
            width = lora_b.shape[3]
            lora = lora_map[tok].long()
            for part in range(lora_b.shape[0]):
                b = lora_b[part][lora.clamp(min=0), experts].float()  # (pairs, width, rank)
                add = torch.einsum("pr,pnr->pn", s[chunk, part].float(), b) * (lora >= 0)[:, None]
                out[:, part * width : (part + 1) * width] += add
        rows.append(out)
    return torch.cat(rows)


CANDIDATES = [  # (block_n, block_k, warps, stages) tried for the base GEMM alone; the folded one runs the winner
    (64, 64, 4, 4),
    (128, 64, 4, 4),
    (128, 64, 8, 3),
    (128, 128, 8, 3),
    (256, 64, 8, 3),
]


def _block_m(m: int) -> int:
    return 16 if m <= 64 else 64


def probe(model: str, m: int, *, rank: int = 32, adapters: int = 8, sets: int = 4, calls: int = 8) -> dict:
    h, inter, e, top_k = MODELS[model]
    slices = W13_SLICES[model]
    n = 2 * inter
    w = (torch.randn(e, n, h, device="cuda") * h**-0.5).to(torch.bfloat16)
    inputs = [make_inputs(model, rank, adapters, m, seed=i) for i in range(sets)]
    block_m = _block_m(m)
    prepared = []
    for inp in inputs:
        sorted_ids, block_expert = align(inp.topk_ids, inp.lora_map, e, block_m)
        out = torch.empty(m * top_k, n, device="cuda", dtype=torch.bfloat16)
        s = torch.randn(m * top_k, slices, rank, device="cuda").to(torch.bfloat16)
        lora_b = torch.stack(inp.w13_b)  # (slices, adapters, E, width, rank)
        layer = default_layer_config(inp, route_method="grouped")  # as the plugin serves it
        prepared.append((inp, sorted_ids, block_expert, out, (s, lora_b, inp.lora_map), layer))

    def gemm(cfg: GemmConfig, fold: bool):
        def run() -> None:
            for _ in range(calls // sets):
                for inp, sorted_ids, block_expert, out, f, _ in prepared:
                    moe_gemm(
                        inp.hidden, w, out, sorted_ids, block_expert, top_k=top_k, cfg=cfg, fold=f if fold else None
                    )

        return run

    def lora(shrink_only: bool):
        def run() -> None:
            for _ in range(calls // sets):
                for inp, *_, layer in prepared:
                    r = layer_routing(inp, layer)
                    kw = dict(x=inp.hidden, lora_a=inp.w13_a, lora_b=inp.w13_b, routing=r, config=layer.w13)
                    if shrink_only:
                        plan_op(output=inp.gate_up_out, **kw).shrink()
                    else:
                        fused_moe_lora(output=inp.gate_up_out, **kw)

        return run

    per = float(calls)
    vllm_gemm = _vllm_gemm(prepared, w, inter, top_k, m, calls // sets)
    timed = {}
    for bn, bk, warps, stages in CANDIDATES:
        if (n // slices) % bn or h % bk:
            continue
        cfg = GemmConfig(block_m, bn, bk, warps, stages)
        timed[cfg] = time_graph(gemm(cfg, False)) / per
    best = min(timed, key=timed.get)
    base = timed[best]
    folded = time_graph(gemm(best, True)) / per
    op = time_graph(lora(False)) / per
    shrink = time_graph(lora(True)) / per
    # The folded GEMM's answer, checked on the first set against PyTorch.
    inp, sorted_ids, block_expert, out, f, _ = prepared[0]
    moe_gemm(inp.hidden, w, out, sorted_ids, block_expert, top_k=top_k, cfg=best, fold=f)
    pairs = torch.arange(min(256, m * top_k), device="cuda")
    want = reference(inp.hidden, w, inp.topk_ids, f, pairs)
    err = ((out[pairs].float() - want).abs().max() / want.abs().max()).item()
    return {
        "model": model, "m": m, "config": best, "base": base, "op": op, "folded": folded, "shrink": shrink,
        "rel_err": err, "vllm": time_graph(vllm_gemm) / per if vllm_gemm else None,
    }  # fmt: skip


def _vllm_gemm(prepared, w, inter: int, top_k: int, m: int, rounds: int):
    """vLLM's fused-MoE GEMM (w13, no routed weight) over the prepared sets, or None where vLLM does not import."""
    try:
        from vllm.model_executor.layers.fused_moe.fused_moe import (
            invoke_fused_moe_triton_kernel,
            try_get_optimal_moe_config,
        )
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
    except (ImportError, OSError, RuntimeError):  # no vLLM, or one without its compiled ops
        return None
    e, _, h = w.shape
    config = try_get_optimal_moe_config(tuple(w.shape), (e, h, inter), top_k, None, m)
    sets = []
    for inp, _, _, out, _, _ in prepared:
        sorted_ids, expert_ids, post = moe_align_block_size(inp.topk_ids, config["BLOCK_SIZE_M"], e)
        sets.append((inp.hidden, out.view(m, top_k, -1), sorted_ids, expert_ids, post))

    def run() -> None:
        for _ in range(rounds):
            for x, out, sorted_ids, expert_ids, post in sets:
                invoke_fused_moe_triton_kernel(
                    x, w, out, None, None, None, sorted_ids, expert_ids, post, False, top_k, config, tl.bfloat16,
                    False, False, False, False, False,
                )  # fmt: skip

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3,gpt-oss")
    ap.add_argument("--m", default="16,64,1600,8192")
    args = ap.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}; rank 32, 8 adapters, gate_up (w13) only; µs a layer")
    print("| model | M | base GEMM | + LoRA op | folded GEMM | + shrink | LoRA apart -> folded | config | err | vLLM |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for m in (int(v) for v in args.m.split(",")):
            r = probe(model, m)
            c = r["config"]
            apart, fold = r["op"], r["folded"] - r["base"] + r["shrink"]
            vllm = "-" if r["vllm"] is None else f"{r['vllm']:.1f}"
            print(
                f"| {model} | {m} | {r['base']:.1f} | {r['base'] + apart:.1f} | {r['folded']:.1f} | "
                f"{r['folded'] + r['shrink']:.1f} | {apart:.1f} -> {fold:.1f} | "
                f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} | {r['rel_err']:.1e} | "
                f"{vllm} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
