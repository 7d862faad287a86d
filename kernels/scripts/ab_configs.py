"""Changes to the bundled layer config against the bundled config itself, on a GPU: every variant and the base are
timed in each of three passes, interleaved. One JSON line per variant.

    PYTHONPATH=kernels python3 kernels/scripts/ab_configs.py gpt-oss:32:8:64 \
        '[{"w13": {"expand_maxnreg": 64}}, {"w2": {"shrink_maxnreg": 96}}]'
"""

import json
import sys

from _cases import cases, changed

from moelora.kernels.tools import bench


def main(specs: str, variants_json: str) -> None:
    variants = [{}] + json.loads(variants_json)
    for spec, case, bw in cases(specs):
        base = bench.default_layer_config(case.sets[0])
        cfgs = [changed(base, v) for v in variants]
        times = [[] for _ in cfgs]
        for _ in range(3):
            for i, cfg in enumerate(cfgs):
                times[i].append(round(case.time(cfg), 2))
        for v, t in zip(variants, times):
            print(
                json.dumps(
                    {
                        "case": spec,
                        "variant": v or "bundled",
                        "us": t,
                        "min_us": min(t),
                        "floor_us": round(case.bytes / bw * 1e6, 2),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
