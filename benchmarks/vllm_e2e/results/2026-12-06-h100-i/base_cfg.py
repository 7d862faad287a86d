"""vLLM's base fused-MoE GEMMs on this GPU at decode sizes: vLLM's own choice (no tuned folder) against the entry of
the shipped H200 file that names.sh serves under this GPU's name. Same inputs, timing and check as tune_moe.
Run: PYTHONPATH=kernels:image:operator:$SITE python3 base_cfg.py [M ...] (call8.sh: as it ran)"""

import json
import math
import os
import sys
from pathlib import Path

import torch

os.environ.pop("VLLM_TUNED_CONFIG_FOLDER", None)
from moelora.kernels.tools.bench import l2_bytes  # noqa: E402
from moelora.kernels.tools.tune import MODEL_PRESETS, measure  # noqa: E402
from moelora.kernels.tools.tune_moe import (  # noqa: E402
    FIELDS,
    ExpertsKernel,
    MoeBucket,
    make_inputs,
    reference,
    vllm_choice,
    vllm_experts,
)

H200 = Path("kernels/moelora/kernels/configs/NVIDIA_H200")
ms = [int(m) for m in (sys.argv[1:] or ["16", "64"])]
dev = torch.device("cuda")
print(torch.cuda.get_device_name(), flush=True)
print("| model | M | vLLM's choice | us | shipped H200 entry | us | H200 / vLLM |")
print("|---|---|---|---|---|---|---|")
for name in ("qwen3-30b-a3b", "gpt-oss-20b"):
    s = MODEL_PRESETS[name]
    table = json.loads((H200 / f"E={s.experts},N={s.inter},device_name=NVIDIA_H200.json").read_text())
    for m in ms:
        b = MoeBucket(s, m)
        first = make_inputs(b, device=dev, dtype=torch.bfloat16, seed=0)
        n = max(1, min(4, math.ceil(3 * l2_bytes() / first.nbytes_touched())))
        sets = [first] + [make_inputs(b, device=dev, dtype=torch.bfloat16, seed=i) for i in range(1, n)]
        refs = [reference(first)]
        theirs = vllm_choice(b)
        near = min(table, key=lambda k: abs(int(k) - m))
        ours = {f: table[near][f] for f in FIELDS}
        t = {}
        for label, cfg in (("vllm", theirs), ("h200", ours)):
            k = ExpertsKernel(vllm_experts, cfg)
            t[label] = measure(k, k.baseline(), sets, refs, cuda=True)
        short = lambda c: "/".join(str(c[f]) for f in FIELDS)  # noqa: E731
        ratio = t["h200"] / t["vllm"] if all(isinstance(v, float) for v in t.values()) else "-"
        r = f"{ratio:.2f}" if isinstance(ratio, float) else ratio
        print(f"| {name} | {m} | {short(theirs)} | {t['vllm']} | {short(ours)} | {t['h200']} | {r} |", flush=True)
        del sets
        torch.cuda.empty_cache()
