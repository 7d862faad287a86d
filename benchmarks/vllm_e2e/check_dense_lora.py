"""The plugin's dense LoRA route (moelora.vllm_plugin.dense_lora) on CUDA against vLLM's own add_lora_linear, at the
GPT-OSS-20B shapes (q/k/v and o, rank 32, 8 adapters, bf16): eagerly at token counts inside and outside the route's
window, on both epilogues, then captured in a CUDA graph and replayed with new adapter mappings (the counters must
be back at zero for each replay). Prints one line per case and exits 1 on a mismatch.

    PYTHONPATH=<vLLM 0.26>:image:kernels python benchmarks/vllm_e2e/check_dense_lora.py
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

SHAPES = {"qkv": (2880, (4096, 512, 512)), "o": (4096, (2880,))}
RANK, LORAS = 32, 8


def main() -> int:
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    from moelora.kernels import dense_config
    from moelora.kernels import dense_splitk as splitk
    from moelora.vllm_plugin import dense_lora

    vllm_fn = PunicaWrapperGPU.add_lora_linear
    dense_lora._original["add_lora_linear"] = vllm_fn
    routed: list[int] = []
    real = splitk.dense_splitk

    def counting(*args, **kwargs):
        routed.append(args[1].shape[0])
        return real(*args, **kwargs)

    splitk.dense_splitk = counting
    dev, dt = torch.device("cuda"), torch.bfloat16
    wrapper = PunicaWrapperGPU(
        8192, 256, dev, lora_config=SimpleNamespace(max_loras=LORAS, specialize_active_lora=False)
    )
    g = torch.Generator(device=dev).manual_seed(0)
    failed = 0
    for name, (k, widths) in SHAPES.items():
        a = tuple((torch.randn(LORAS, 1, RANK, k, device=dev, generator=g) * k**-0.5).to(dt) for _ in widths)
        b = tuple((torch.randn(LORAS, 1, n, RANK, device=dev, generator=g) * 0.05).to(dt) for n in widths)

        # Eager first with a batch outside the window: the layer is prepared there (as in the plugin's warm-up).
        for m in (100, 1, 2, 5, 16, 17, 64, 65):
            for add in (False, True):
                mapping = torch.randint(-1, LORAS, (m,), device=dev, generator=g, dtype=torch.int32)
                x = torch.randn(m, k, device=dev, generator=g).to(dt)
                base = torch.randn(m, sum(widths), device=dev, generator=g).to(dt)
                base = base if add else torch.zeros_like(base)
                before = len(routed)
                wrapper.token_mapping_meta.prepare_tensors(mapping)
                want, got = base.clone(), base.clone()
                vllm_fn(wrapper, want, x, a, b, 1.0, widths, add_inputs=add)
                dense_lora.add_lora_linear(wrapper, got, x, a, b, 1.0, widths, add_inputs=add)
                scale = (want.float() - base.float()).abs().max().item() or 1.0
                err = (got.float() - want.float()).abs().max().item() / scale
                ok = err < 0.03 and (len(routed) > before) == (dense_config.served_config(m, len(widths)) is not None)
                failed += not ok
                print(
                    f"{name} M={m} add={add}: routed={len(routed) > before} error/max={err:.1e}", "ok" if ok else "FAIL"
                )
        # Captured at M = 16 (the served second-stream side), replayed with three new mappings.
        m = 16
        x = torch.randn(m, k, device=dev, generator=g).to(dt)
        out = torch.zeros(m, sum(widths), device=dev, dtype=dt)
        wrapper.token_mapping_meta.prepare_tensors(torch.arange(m, device=dev, dtype=torch.int32) % LORAS)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        before = len(routed)
        with torch.cuda.graph(graph, stream=stream):
            out.zero_()
            dense_lora.add_lora_linear(wrapper, out, x, a, b, 1.0, widths, add_inputs=False)
        captured = len(routed) > before
        for replay in range(3):
            mapping = torch.randint(-1, LORAS, (m,), device=dev, generator=g, dtype=torch.int32)
            wrapper.token_mapping_meta.prepare_tensors(mapping)
            graph.replay()
            want = torch.zeros_like(out)
            vllm_fn(wrapper, want, x, a, b, 1.0, widths, add_inputs=False)
            torch.cuda.synchronize()
            err = (out.float() - want.float()).abs().max().item() / (want.float().abs().max().item() or 1.0)
            ok = captured and err < 0.03 and not splitk._counters[x.device].any()
            failed += not ok
            print(f"{name} graph M={m} replay {replay}: routed={captured} error/max={err:.1e} {'ok' if ok else 'FAIL'}")
    print("FAILED" if failed else "all ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
