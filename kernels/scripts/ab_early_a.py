"""The down op's shrink fetching its first A tile before its PDL wait (the routing is settled by then) against
fetching it after, on a GPU, for the bundled config and for down-op shrink variants. One JSON line per case.

    PYTHONPATH=kernels python3 kernels/scripts/ab_early_a.py gpt-oss:32:8:64,gpt-oss:32:8:256   # model:rank:adapters:M
"""

import json
import sys
from dataclasses import replace

from _cases import cases

from moelora.kernels import routing
from moelora.kernels.tools import bench

# (shrink_block_k, split_k, shrink_warps, shrink_stages) for the down op; split_k is clamped to whole iterations.
VARIANTS = [
    None,
    (128, 4, 2, 1),
    (256, 16, 4, 1),
    (256, 16, 8, 1),
    (512, 16, 8, 1),
    (512, 16, 4, 1),
    (128, 8, 4, 1),
    (256, 4, 4, 2),
]


def main(specs: str) -> None:
    settled = routing.MoeLoraRouting.begin_op
    for spec, case, bw in cases(specs):
        base = bench.default_layer_config(case.sets[0])
        for v in VARIANTS:
            cfg = (
                base
                if v is None
                else replace(
                    base, w2=replace(base.w2, shrink_block_k=v[0], split_k=v[1], shrink_warps=v[2], shrink_stages=v[3])
                )
            )
            routing.MoeLoraRouting.begin_op = lambda self, **kw: (False, settled(self, **kw)[1])
            after = case.time(cfg)
            routing.MoeLoraRouting.begin_op = settled
            before = case.time(cfg)
            print(
                json.dumps(
                    {
                        "case": spec,
                        "w2_shrink": v or "bundled",
                        "a_after_wait_us": round(after, 2),
                        "a_before_wait_us": round(before, 2),
                        "floor_us": round(case.bytes / bw * 1e6, 2),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1])
