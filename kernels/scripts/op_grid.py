"""Time one op's launch parameters over a full grid, inside the layer, on a CUDA GPU.

    python3 kernels/scripts/op_grid.py gpt-oss 64 w13 expand [--route grouped]

The layer runs with the bundled configs; only the named kernel's parameters vary (all combinations of the lists
below, where the coordinate descent of `bench --sweep` moves one at a time). Times are the layer prefix up to and
including that kernel (bench's `stages`), CUDA-graph medians as in bench; one line per point, fastest last.
"""

import argparse
import itertools
from dataclasses import replace

from moelora.kernels.tools.bench import Case, default_layer_config

GRIDS = {
    "shrink": {
        "split_k": (1, 2, 4, 8),
        "shrink_block_k": (64, 128, 256),
        "shrink_warps": (2, 4, 8),
        "shrink_stages": (3,),
    },
    "expand": {
        "expand_block_n": (64, 128, 256),
        "expand_tiles": (1, 4, 8, 16),
        "expand_stages": (1, 2, 3, 4),
        "expand_warps": (4,),
    },
}
STAGE = {("w13", "shrink"): 2, ("w13", "expand"): 3, ("w2", "shrink"): 4, ("w2", "expand"): 5}

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("m", type=int)
p.add_argument("op", choices=("w13", "w2"))
p.add_argument("kernel", choices=("shrink", "expand"))
p.add_argument("--route", default="auto")
p.add_argument("--rank", type=int, default=32)
p.add_argument("--adapters", type=int, default=8)
args = p.parse_args()

case = Case(args.model, args.rank, args.adapters, args.m)
base = default_layer_config(case.sets[0], route_method=args.route)
stage = STAGE[(args.op, args.kernel)]
print(
    f"# {args.model} M={args.m} {args.op} {args.kernel}, route {args.route}, layer prefix of {stage} steps; "
    f"base {base}",
    flush=True,
)
print(
    f"base {case.time(base, stages=stage):.1f} us; without this kernel {case.time(base, stages=stage - 1):.1f} us",
    flush=True,
)
grid = GRIDS[args.kernel]
results = []
for values in itertools.product(*grid.values()):
    point = dict(zip(grid, values))
    if args.kernel == "expand" and point["expand_block_n"] * point["expand_tiles"] > 4096:
        continue
    cfg = replace(base, **{args.op: replace(getattr(base, args.op), **point)})
    try:
        us = case.time(cfg, stages=stage)
    except Exception as exc:  # noqa: BLE001 - a point that does not compile or launch is reported, not fatal
        print(f"{point} failed: {exc!s:.80}", flush=True)
        continue
    results.append((us, point))
    print(f"{us:7.1f} us {point}", flush=True)
print("# fastest")
for us, point in sorted(results, key=lambda r: r[0])[:8]:
    print(f"{us:7.1f} us {point}")
