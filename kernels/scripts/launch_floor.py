"""What a chain of dependent kernels costs on this GPU before any of them does the op's work: the floor under a
decode-size MoE-LoRA layer, which is two (one-pass) or four (two-kernel) dependent kernels.

    PYTHONPATH=kernels python3 kernels/scripts/launch_floor.py

Each variant is a chain of small kernels launched as the op's are (programmatic dependent launch, 23 CTAs of 4
warps), 80 of them captured in one CUDA graph; printed: µs per kernel, the graph replay median over 80.
- empty: wait for the previous kernel, start the next, nothing else;
- l2: then one load of a value the previous kernel wrote, and one store (a dependent L2 round trip);
- dram: also one 16 KB tile per CTA from a buffer larger than the L2, at an offset that moves from kernel to kernel
  (one DRAM round trip, independent of the previous kernel, issued before the wait);
- exchange: dram, then each CTA stores a partial, counts it on a counter and spins until all 23 have, then counts
  itself again and the last one resets the counter (onepass.py's first hand-over);
- exchange_base: the same with a count that only grows and a base that CTA 0 moves on with a plain store (its
  hand-over now).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moelora.kernels.tools import bench


@triton.jit
def _link(
    buf_ptr,  # (many,) bf16 buffer larger than the L2
    val_ptr,  # (1,) int32 written by the previous link
    part_ptr,  # (CTAS, 32) float32
    count_ptr,  # (1,) int32, zero between links
    offset,
    ctas,
    MODE: tl.constexpr,  # 0 empty, 1 l2, 2 dram, 3 exchange, 4 exchange with a moving base
):
    pid = tl.program_id(0)
    offs = tl.arange(0, 8192)
    if MODE >= 2:
        tile = tl.load(buf_ptr + offset + pid * 8192 + offs)
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    if MODE >= 1:
        v = tl.load(val_ptr)
        if MODE >= 2:
            v += tl.sum(tile.to(tl.float32), 0).to(tl.int32)
        if MODE == 3:
            tl.store(part_ptr + pid * 32 + tl.arange(0, 32), tl.zeros([32], tl.float32) + v.to(tl.float32))
            tl.debug_barrier()
            tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
            while tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu") < ctas:
                pass
            v += tl.sum(tl.load(part_ptr + tl.arange(0, 32), cache_modifier=".cg"), 0).to(tl.int32)
            if tl.atomic_add(count_ptr, 1, sem="relaxed", scope="gpu") == 2 * ctas - 1:
                tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
        if MODE == 4:
            base = tl.load(count_ptr + 1, cache_modifier=".cg")
            tl.store(part_ptr + pid * 32 + tl.arange(0, 32), tl.zeros([32], tl.float32) + v.to(tl.float32))
            tl.debug_barrier()
            tl.atomic_add(count_ptr + 2, 1, sem="release", scope="gpu")
            while tl.atomic_add(count_ptr + 2, 0, sem="acquire", scope="gpu") - base < ctas:
                pass
            v += tl.sum(tl.load(part_ptr + tl.arange(0, 32), cache_modifier=".cg"), 0).to(tl.int32)
            if pid == 0:
                tl.store(count_ptr + 1, base + ctas)
        if pid == 0:
            tl.store(val_ptr, v + 1)


def main() -> None:
    ctas, links = 23, 80
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buf = torch.randn(4 * l2 // 2, device="cuda").to(torch.bfloat16)
    val = torch.zeros(1, dtype=torch.int32, device="cuda")
    part = torch.zeros(ctas, 32, dtype=torch.float32, device="cuda")
    count = torch.zeros(3, dtype=torch.int32, device="cuda")  # exchange's counter; arrivals and base
    span = ctas * 8192
    slots = buf.numel() // span
    for mode, name in enumerate(("empty", "l2", "dram", "exchange", "exchange_base")):

        def chain(mode: int = mode) -> None:
            for i in range(links):
                _link[(ctas,)](buf, val, part, count, (i % slots) * span, ctas, MODE=mode, num_warps=4, launch_pdl=True)

        print(f"{name}: {bench.time_graph(chain) / links:.2f} us per kernel", flush=True)
    assert int(count[0]) == 0, "the exchange's counter was left above zero"
    assert int(count[1]) == int(count[2]), "the base did not follow the arrivals"


if __name__ == "__main__":
    main()
