"""The layer with the expand waiting per block (readiness counters) against waiting for the whole shrink grid, same
bundled configs otherwise, on a GPU. One JSON line per case.

    PYTHONPATH=kernels python3 kernels/scripts/ab_wait.py gpt-oss:32:8:256,qwen3:64:16:1600   # model:rank:adapters:M
"""

import json
import sys
from dataclasses import replace

from _cases import cases

from moelora.kernels.tools import bench


def main(specs: str) -> None:
    for spec, case, bw in cases(specs):
        per_block = bench.default_layer_config(case.sets[0])
        grid = replace(
            per_block, w13=replace(per_block.w13, wait_per_block=False), w2=replace(per_block.w2, wait_per_block=False)
        )
        t_grid, t_block = case.time(grid), case.time(per_block)
        print(
            json.dumps(
                {
                    "case": spec,
                    "route": bench.routing_method(per_block, case.sets[0]),
                    "grid_wait_us": round(t_grid, 2),
                    "per_block_us": round(t_block, 2),
                    "floor_us": round(case.bytes / bw * 1e6, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1])
