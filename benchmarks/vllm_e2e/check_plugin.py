"""Fail-fast check of the plugin on the GPU, inside the real vLLM (the pinned release), before any server starts.

1. vLLM's own plugin loader finds and runs the plugin (entry point via make_entry_point.py) and the dispatcher's
   CUDA kernel of `vllm::fused_moe_lora` is ours afterwards.
2. At GPT-OSS-20B shapes (bf16, rank 32, 8 adapters, E=32, top-4), the op through `torch.ops.vllm.fused_moe_lora`
   equals vLLM's own kernel (`_fused_moe_lora`, kept aside) within bf16 rounding, for the naive routing (few tokens)
   and the blocked routing built by vLLM's CUDA `moe_lora_align_block_size`, for w13 (2 slices) and w2.
3. CUDA-graph timing of one MoE layer's two LoRA ops, ours vs vLLM's, at those sizes.
Prints a table; exits non-zero on any failure.
Usage: python check_plugin.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

H, INTER, E, TOP_K, RANK, LORAS = 2880, 2880, 32, 4, 32, 8


def dispatch_owner() -> str:
    lines = torch._C._dispatch_dump("vllm::fused_moe_lora").splitlines()
    return next(line for line in lines if line.startswith("CUDA:"))


def make_layer(m: int, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    scores = torch.rand(m, E, generator=g, device="cuda")
    w, ids = scores.softmax(-1).topk(TOP_K, dim=-1)
    mapping = torch.randint(-1, LORAS, (m,), generator=g, device="cuda").to(torch.int32)
    uniq = torch.unique(mapping)
    lora_ids = torch.full((LORAS + 1,), -1, dtype=torch.int32, device="cuda")
    lora_ids[: uniq.numel()] = uniq.to(torch.int32)
    return {
        "hidden": rnd(m, H),
        "act": rnd(m * TOP_K, INTER),
        "w13": rnd(m, TOP_K, 2 * INTER),
        "w2": rnd(m, TOP_K, H),
        "w13_a": [rnd(LORAS, E, RANK, H, scale=H**-0.5) for _ in range(2)],
        "w13_b": [rnd(LORAS, E, INTER, RANK, scale=0.05) for _ in range(2)],
        "w2_a": [rnd(LORAS, E, RANK, INTER, scale=INTER**-0.5)],
        "w2_b": [rnd(LORAS, E, H, RANK, scale=0.05)],
        "ids": ids.to(torch.int32),
        "weights": w.float(),
        "mapping": mapping,
        "lora_ids": lora_ids,
        "enabled": torch.ones(LORAS + 1, dtype=torch.int32, device="cuda"),
    }


def routing(layer: dict, m: int, block_m: int, naive: bool):
    from vllm import _custom_ops as ops
    from vllm.triton_utils import triton

    ids = layer["ids"]
    if naive:
        return None, ids.reshape(-1), None
    padded = ids.numel() + E * (block_m - 1)
    if ids.numel() < E:
        padded = ids.numel() * block_m
    blocks = triton.cdiv(padded, block_m)
    sorted_ids = torch.empty(LORAS * padded, dtype=torch.int32, device="cuda")
    expert_ids = torch.full((LORAS * blocks,), -1, dtype=torch.int32, device="cuda")
    npad = torch.empty(LORAS, dtype=torch.int32, device="cuda")
    ops.moe_lora_align_block_size(
        ids,
        layer["mapping"],
        E,
        block_m,
        LORAS,
        padded,
        blocks,
        sorted_ids,
        expert_ids,
        npad,
        layer["enabled"],
        layer["lora_ids"],
        None,
    )
    return sorted_ids.view(LORAS, -1), expert_ids.view(LORAS, -1), npad


def call(op, layer: dict, out: torch.Tensor, which: str, route, block_m: int) -> None:
    sorted_ids, expert_ids, npad = route
    x, a, b = (
        (layer["hidden"], layer["w13_a"], layer["w13_b"])
        if which == "w13"
        else (layer["act"], layer["w2_a"], layer["w2_b"])
    )
    op(
        out,
        x,
        a,
        b,
        layer["weights"],
        sorted_ids,
        expert_ids,
        npad,
        layer["mapping"],
        RANK,
        TOP_K,
        layer["lora_ids"],
        torch.tensor([LORAS + 1]),
        layer["enabled"],  # vLLM's default: max_loras + 1 (the -1 slot)
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
        which == "w2",
        False,
        0,
        True,
    )


def reference(layer: dict, out: torch.Tensor, which: str) -> None:
    """The contribution from the true topk_ids in plain torch (the plugin's CPU path, independent of both kernels)."""
    from moelora.vllm_plugin.torch_path import moe_lora_torch

    m = out.shape[0]
    x = layer["hidden"] if which == "w13" else layer["act"].view(m, TOP_K, -1)
    a, b = (layer["w13_a"], layer["w13_b"]) if which == "w13" else (layer["w2_a"], layer["w2_b"])
    width = b[0].shape[2]
    for i in range(len(a)):
        moe_lora_torch(
            output=out[:, :, i * width : (i + 1) * width],
            x=x,
            lora_a=a[i],
            lora_b=b[i],
            topk_ids=layer["ids"],
            token_lora_mapping=layer["mapping"],
            topk_weights=layer["weights"],
            mul_routed_weight=which == "w2",
        )


def graph_us(fn, replays: int = 50) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / replays


def _timed(fn) -> str:
    try:  # a timing failure is reported, never fatal: correctness is the gate
        return f"{graph_us(fn):.1f}"
    except Exception as exc:  # noqa: BLE001
        return f"n/a ({type(exc).__name__})"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--no-timing", action="store_true")
    args = p.parse_args()
    timing_on = not args.no_timing
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    owner = dispatch_owner()
    print("CUDA kernel of vllm::fused_moe_lora:", owner)
    if "moelora" not in owner:
        print("FAIL: the plugin did not replace the op")
        return 1
    from vllm.lora.ops.triton_ops.fused_moe_lora_op import _fused_moe_lora as vllm_op

    ours = torch.ops.vllm.fused_moe_lora
    rows, ok = [], True
    print(
        "| tokens M | routing | op | moelora vs vLLM | moelora vs torch ref | vLLM vs torch ref | vLLM layer µs "
        "| moelora layer µs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for m in (4, 16, 64, 256, 1600):
        layer = make_layer(m, seed=m)
        naive = m * TOP_K * 8 <= E * LORAS  # punica_gpu's SPARSITY_FACTOR rule
        block_m = 16
        route = routing(layer, m, block_m, naive)
        for which in ("w13", "w2"):
            base = layer[which]
            got, want, ref = base.clone(), base.clone(), base.clone()
            call(ours, layer, got, which, route, block_m)
            call(vllm_op, layer, want, which, route, block_m)
            reference(layer, ref, which)
            delta = (ref.double() - base.double()).norm().item()
            err = (got.double() - want.double()).norm().item() / max(delta, 1e-30)
            err_ref = (got.double() - ref.double()).norm().item() / max(delta, 1e-30)
            err_vllm_ref = (want.double() - ref.double()).norm().item() / max(delta, 1e-30)
            ok &= err < 3e-2 and err_ref < 3e-2 and delta > 0
            timing = ("", "")
            if which == "w2" and timing_on:
                bufs = {k: layer[k].clone() for k in ("w13", "w2")}

                def layer_fn(op, layer=layer, bufs=bufs, route=route, block_m=block_m):
                    def fn():
                        call(op, layer, bufs["w13"], "w13", route, block_m)
                        call(op, layer, bufs["w2"], "w2", route, block_m)

                    return fn

                timing = tuple(_timed(layer_fn(op)) for op in (vllm_op, ours))
            rows.append(
                {
                    "m": m,
                    "naive": naive,
                    "op": which,
                    "err": err,
                    "err_ref": err_ref,
                    "err_vllm_ref": err_vllm_ref,
                    "vllm_us": timing[0],
                    "moelora_us": timing[1],
                }
            )
            print(
                f"| {m} | {'naive' if naive else 'blocked'} | {which} | {err:.2e} | {err_ref:.2e} | "
                f"{err_vllm_ref:.2e} | {timing[0]} | {timing[1]} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"owner": owner, "rows": rows, "ok": ok}, f, indent=1)
    print("plugin check", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
