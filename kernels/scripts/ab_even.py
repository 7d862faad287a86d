"""Expand spans and shrink splits that divide N and K evenly (N_TILES need not be a power of two) against the
bundled configs, on a GPU: each variant changes one op, then the best of each kind are combined. One JSON line each.

    PYTHONPATH=kernels python3 kernels/scripts/ab_even.py gpt-oss:32:8:64   # model:rank:adapters:M, comma list
    PYTHONPATH=kernels python3 kernels/scripts/ab_even.py gpt-oss:32:8:64 '{"w13": {"expand_block_n": 128}}'

The optional JSON changes the bundled configs before anything is timed ("base"). Every variant is timed twice, in
two passes, and reported with both figures.
"""

import json
import sys
from dataclasses import replace

from _cases import cases, changed

from moelora.kernels.tools import bench

# (expand_block_n, expand_tiles, expand_stages, expand_warps); kept where block_n * tiles divides N, or when last.
EXPANDS = [
    (64, 15, 3, 4),
    (64, 18, 3, 4),
    (64, 9, 3, 4),
    (64, 5, 3, 4),
    (128, 9, 3, 4),
    (128, 9, 4, 4),
    (128, 9, 2, 4),
    (128, 15, 3, 4),
    (128, 5, 3, 4),
    (128, 9, 3, 8),
    (64, 45, 3, 4),
    (128, 3, 3, 4),
]
UNEVEN = [(128, 4, 3, 4), (128, 8, 3, 4), (64, 8, 3, 4), (64, 16, 3, 4)]
SHRINKS = [(64, 3, 2, 4), (64, 3, 4, 4), (128, 2, 2, 4), (256, 1, 4, 3)]  # (block_k, split, warps, stages)


def main(specs: str, base_json: str = "{}") -> None:
    for spec, case, bw in cases(specs):
        base = changed(bench.default_layer_config(case.sets[0]), json.loads(base_json))
        base_us = min(case.time(base), case.time(base))
        print(json.dumps({"case": spec, "variant": "base", "us": round(base_us, 2), "config": str(base)}), flush=True)
        best = {}
        for op in ("w13", "w2"):
            n = getattr(case.sets[0], f"{op}_b").shape[2]
            cands = [
                (
                    "expand",
                    v,
                    replace(
                        getattr(base, op), expand_block_n=v[0], expand_tiles=v[1], expand_stages=v[2], expand_warps=v[3]
                    ),
                )
                for v in [e for e in EXPANDS if n % (e[0] * e[1]) == 0] + UNEVEN
            ]
            cands += [
                (
                    "shrink",
                    v,
                    replace(
                        getattr(base, op), shrink_block_k=v[0], split_k=v[1], shrink_warps=v[2], shrink_stages=v[3]
                    ),
                )
                for v in SHRINKS
            ]
            timed = [(kind, v, op_cfg, [case.time(replace(base, **{op: op_cfg}))]) for kind, v, op_cfg in cands]
            for kind, v, op_cfg, runs in timed:
                runs.append(case.time(replace(base, **{op: op_cfg})))
                us = min(runs)
                print(
                    json.dumps({"case": spec, "op": op, "kind": kind, "variant": v, "us": [round(r, 2) for r in runs]}),
                    flush=True,
                )
                if us < best.get((op, kind), (base_us, None))[0]:
                    best[(op, kind)] = (us, v)
        cfg = base
        for (op, kind), (_, v) in best.items():
            fields = (
                ("expand_block_n", "expand_tiles", "expand_stages", "expand_warps")
                if kind == "expand"
                else ("shrink_block_k", "split_k", "shrink_warps", "shrink_stages")
            )
            cfg = replace(cfg, **{op: replace(getattr(cfg, op), **dict(zip(fields, v)))})
        us = min(case.time(cfg), case.time(cfg))
        print(
            json.dumps(
                {
                    "case": spec,
                    "variant": "combined",
                    "picks": {f"{o}.{k}": v for (o, k), (_, v) in best.items()},
                    "us": round(us, 2),
                    "base_again_us": round(case.time(base), 2),
                    "floor_us": round(case.bytes / bw * 1e6, 2),
                    "config": str(cfg),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
