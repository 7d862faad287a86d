"""One GPT-OSS/Qwen3 layer call per M under Nsight Compute: per-kernel time, DRAM throughput, occupancy.

    ncu --clock-control none --profile-from-start off --metrics ... \
        python3 kernels/scripts/profile_layer.py gpt-oss 16 64
Only the second call of each M is profiled (the first compiles); ncu runs kernels one at a time, so PDL overlap and
graph replay are not what it shows: it answers "how fast is each kernel on its own", not "how long is the layer".
"""

import sys

import torch

from moelora.kernels.tools.bench import default_layer_config, make_inputs, run_layer

model = sys.argv[1]
for m in (int(v) for v in sys.argv[2:]):
    inp = make_inputs(model, 32, 8, m)
    cfg = default_layer_config(inp)
    run_layer(inp, cfg)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run_layer(inp, cfg)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"{model} M={m} profiled: {cfg}", flush=True)
