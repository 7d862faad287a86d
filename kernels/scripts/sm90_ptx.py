"""Compile the op's kernels for sm_90 on a machine without a GPU: registers, spills and a PTX fingerprint per
launch configuration, with the specialisation Triton applies at run time (16-byte aligned pointers, sizes and
strides divisible by 16, unit strides as constants).

    .venv/bin/python kernels/scripts/sm90_ptx.py            # one line per configuration

Two checkouts giving the same fingerprints compile to the same code (debug line info aside): how a refactor is
checked when no GPU is at hand. Without the run-time specialisation every B load compiles to a 2-byte load and the
register counts are wrong, so it matters that the signature below says what the launcher passes.
"""

import hashlib
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from moelora.kernels import dense_config, dense_folded, dense_splitk, expand, onepass, routing, shrink

TARGET = GPUTarget("cuda", 90, 32)
POINTERS = {
    "x_ptr": "*bf16",
    "a_ptr": "*bf16",
    "a1_ptr": "*bf16",
    "b_ptr": "*bf16",
    "b1_ptr": "*bf16",
    "out_ptr": "*bf16",
    "part_ptr": "*fp32",
    "topk_w_ptr": "*fp32",
    "sorted_ptr": "*i32",
    "table_ptr": "*i32",
    "num_blocks_ptr": "*i32",
    "topk_ptr": "*i32",
    "lora_ptr": "*i32",
    "ready_ptr": "*i32",
    "scale_ptr": "*fp32",
    "topk_ids_ptr": "*i32",
    "counts_ptr": "*i32",
    "rank_ptr": "*i32",
    "group_end_ptr": "*i32",
    "count_ptr": "*i32",
    # dense_splitk, dense_folded
    "y_ptr": "*bf16",
    "yp_ptr": "*bf16",
    "a_ptrs": "*i64",
    "b_ptrs": "*i64",
    "slice_n_ptr": "*i32",
    "slice_col_ptr": "*i32",
    "b_lora_stride_ptr": "*i64",
    "start_ptr": "*i32",
    "ids_ptr": "*i32",
    "count_words": "*i32",
    "scale": "fp32",
}
UNIT_STRIDES = {"stride_xk", "stride_ak", "stride_br", "stride_on"}
NOT_DIVISIBLE = {
    "num_pairs",
    "max_blocks",
    "ready_len",
    "top_k",
    "num_experts",
    "max_loras",
    "rank",
    "stride_w",
    "n_split",
    "k_tiles",
    "n_tiles",
    # dense_splitk's free integers (do_not_specialize) and its float
    "num_tokens",
    "groups",
    "row_blocks",
    "n_chunks",
    "scale",
}
CUOBJDUMP = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"


def compile_sm90(kernel, consts: dict, warps: int, stages: int, pointers: dict | None = None):
    consts = dict(consts, **{n: 1 for n in kernel.arg_names if n in UNIT_STRIDES})
    types = POINTERS | (pointers or {})
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in kernel.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(kernel.arg_names)
        if n not in consts and n not in NOT_DIVISIBLE
    }
    return triton.compile(
        ASTSource(kernel, signature, constexprs=consts, attrs=attrs),
        target=TARGET,
        options={"num_warps": warps, "num_stages": stages},
    )


def sliced(consts: dict, off_name: str, slices: int) -> dict:
    """consts for a `slices`-slice op: one slice passes no second slice's pointer (None, a constexpr, as the
    launcher does)."""
    return dict(consts, NUM_SLICES=slices, **({off_name: None} if slices == 1 else {}))


def describe(compiled) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    usage = subprocess.run(
        [str(CUOBJDUMP), "--dump-resource-usage", f.name], check=True, capture_output=True, text=True
    ).stdout
    os.unlink(f.name)
    regs = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    code = compiled.asm["ptx"].split(".section\t.debug")[0]
    # Debug line info aside: .loc/.file directives, comments, and the $L__tmp labels that mark inlined helpers' scopes.
    code = re.sub(r"^\s*\.(loc|file).*$|//.*$|^\$L__tmp\d+:$", "", code, flags=re.MULTILINE)
    code = re.sub(r"\n\s*\n+", "\n", code)
    fingerprint = hashlib.sha1(code[code.index(".entry") :].encode()).hexdigest()[:10]
    return f"regs {regs[1]:>3} stack {regs[2]:>4} ptx {fingerprint}"


def main() -> None:
    # The single-slice lines keep their labels (a refactor compares them); two slices (Qwen3's gate_up) add lines.
    for slices, direct, ready in itertools.product((1, 2), (False, True), (False, True)):
        if direct and ready:
            continue
        tag = "" if slices == 1 else " slices=2"
        for block_n, tiles, stages, even_n in (
            (512, 1, 1, False),
            (64, 16, 3, False),
            (256, 2, 1, True),
            (128, 8, 3, True),
        ):
            consts = {
                "MUL_ROUTED_WEIGHT": True,
                "BLOCK_M": 16,
                "BLOCK_N": block_n,
                "N_TILES": tiles,
                "RANK_PAD": 32,
                "SPLIT_K": 2,
                "EVEN_N": even_n,
                "EVEN_R": True,
                "DIRECT": direct,
                "READY": ready,
                "USE_PDL": True,
                "SCALED": False,
            }
            print(
                f"expand direct={direct:d} ready={ready:d} block_n={block_n} tiles={tiles} stages={stages} "
                f"even_n={even_n:d}{tag}: "
                + describe(compile_sm90(expand._expand_kernel, sliced(consts, "b1_ptr", slices), 4, stages))
            )
            if (block_n, tiles) == (128, 8):
                # The experts' LoRA in int8 (expert_int8): B as integers, the intermediate scaled per rank.
                print(
                    f"expand int8 direct={direct:d} ready={ready:d} block_n={block_n} tiles={tiles} stages={stages} "
                    f"even_n={even_n:d}{tag}: "
                    + describe(
                        compile_sm90(
                            expand._expand_kernel,
                            sliced(consts | {"SCALED": True}, "b1_ptr", slices),
                            4,
                            stages,
                            {"b_ptr": "*i8", "b1_ptr": "*i8"},
                        )
                    )
                )
        # The gate_up op's shrink (x per token), then the down op's (x per pair; the routing is settled, so
        # grouped, it fetches A before its wait), one of them with the whole split's A in one tile.
        for block_k, warps, stages, per_pair in ((128, 2, 4, False), (256, 4, 3, True), (512, 4, 1, True)):
            early = per_pair and not direct and shrink.early_a_fits(block_k, 32, warps)
            consts = {
                "X_PER_PAIR": per_pair,
                "BLOCK_M": 16,
                "BLOCK_K": block_k,
                "RANK_PAD": 32,
                "SPLIT_K": 2,
                "EVEN_K": False,
                "EVEN_R": True,
                "DIRECT": direct,
                "READY": ready,
                "USE_PDL": True,
                "A_BEFORE_WAIT": early,
            }
            print(
                f"shrink direct={direct:d} ready={ready:d} block_k={block_k} warps={warps} stages={stages} "
                f"per_pair={per_pair:d} a_before_wait={early:d}{tag}: "
                + describe(compile_sm90(shrink._shrink_kernel, sliced(consts, "a1_ptr", slices), warps, stages))
            )
            if block_k == 256:
                int8_a = {"a_ptr": "*i8", "a1_ptr": "*i8"}
                print(
                    f"shrink int8 direct={direct:d} ready={ready:d} block_k={block_k} warps={warps} stages={stages} "
                    f"per_pair={per_pair:d} a_before_wait={early:d}{tag}: "
                    + describe(
                        compile_sm90(shrink._shrink_kernel, sliced(consts, "a1_ptr", slices), warps, stages, int8_a)
                    )
                )
    # The one-kernel op (onepass routing): the gate_up op (x per token, routing not yet settled, one or two slices)
    # and the down op (x per pair, routed weights, settled), GPT-OSS's tiles.
    for slices, per_pair, block_k, block_n, warps, stages in (
        (1, False, 64, 256, 4, 2),
        (2, False, 64, 256, 4, 2),
        (1, True, 64, 256, 4, 2),
        (1, False, 128, 128, 8, 3),
        (1, True, 32, 64, 4, 4),
    ):
        consts = {
            "X_PER_PAIR": per_pair,
            "MUL_ROUTED_WEIGHT": per_pair,
            "BLOCK_K": block_k,
            "BLOCK_N": block_n,
            "RANK_PAD": 32,
            "SPLIT_PAD": onepass.SPLIT_PAD,
            "EVEN_K": True,
            "EVEN_N": False,
            "EVEN_R": True,
            "ROUTING_SETTLED": per_pair,
            "USE_PDL": True,
            "NUM_SLICES": slices,
            "PHASE": 0,
        }
        if slices == 1:
            consts.update(a1_ptr=None, b1_ptr=None)
        print(
            f"onepass per_pair={per_pair:d} block_k={block_k} block_n={block_n} warps={warps} stages={stages} "
            f"slices={slices}: " + describe(compile_sm90(onepass._onepass_kernel, consts, warps, stages))
        )
    # The routing kernels, as moe_lora_routing launches them at 256 pairs over 256 groups.
    print(
        "route tiny: "
        + describe(compile_sm90(routing._route_tiny_kernel, {"BLOCK": 256, "BLOCK_M": 16, "USE_PDL": True}, 16, 1))
    )
    for single in (True, False):
        print(
            f"route finish single={single:d}: "
            + describe(
                compile_sm90(
                    routing._route_finish_kernel,
                    {"BLOCK": 1024, "GROUPS_PAD": 256, "BLOCK_M": 16, "SINGLE": single, "USE_PDL": True},
                    8,
                    1,
                )
            )
        )
    print("route count: " + describe(compile_sm90(routing._route_count_kernel, {"BLOCK": 1024}, 4, 1)))
    # A dense layer's LoRA in one launch, every served config (q/k/v: 3 slices; o: 1), adding and writing; 9 groups
    # (vLLM's max_loras 8, plus rows without an adapter), rank 32.
    for slices, add in itertools.product((3, 1), (True, False)):
        for config in dense_config.served_configs(slices):
            consts = {
                "NUM_SLICES": slices,
                "GROUPS_PAD": 16,
                "TABLE": 9,
                "BLOCK_M": 16,
                "BLOCK_N": config.block_n,
                "BLOCK_K": config.block_k,
                "RANK_PAD": 32,
                "SPLIT_PAD": triton.next_power_of_2(config.split_k),
                "ADD": add,
            }
            compiled = compile_sm90(dense_splitk._dense_splitk_kernel, consts, config.num_warps, config.num_stages)
            print(
                f"dense add={add:d} slices={slices} split_k={config.split_k} block_k={config.block_k} "
                f"block_n={config.block_n}: " + describe(compiled)
            )
    # The expand after the shrink folded into the base GEMM, at the block sizes bench_dense --beside tries.
    for slices, block_n, warps in itertools.product((3, 1), (32, 64, 128), (2, 4)):
        consts = {"NUM_SLICES": slices, "TABLE": 9, "GROUPS_PAD": 16, "BLOCK_M": 16, "BLOCK_N": block_n, "RANK_PAD": 32}
        compiled = compile_sm90(dense_folded._folded_expand_kernel, consts, warps, 1)
        print(f"folded slices={slices} block_n={block_n} warps={warps}: " + describe(compiled))


if __name__ == "__main__":
    main()
