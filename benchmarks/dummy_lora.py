"""What one making of vLLM's warm-up dummy adapter costs for Qwen3-30B-A3B's MoE at 8, 24 and 48 layers, on this
host: vLLM's own `LoRALayerWeights.create_dummy_lora_weights` per expert projection (rank 8, the warm-up rank) and
`PackedLoRALayerWeights.pack_moe` per layer, as `LoRAModelManager.create_dummy_lora` calls them for a MoE layer with
LoRA on every expert (attention's four dense modules left out: a few tensors a layer). Pinned where vLLM pins (a CUDA
host); on a host without CUDA the tensors are pageable, so the figures leave out the pinned allocation and copy.
A second pod makes the dummy 5 times under vLLM 0.26 (profile run, graph-memory profile, compile warm-up, two capture
phases); `dummy_loras` makes it once.

    PYTHONPATH=image:kernels:operator .venv/bin/python benchmarks/dummy_lora.py
"""

from __future__ import annotations

import time

import torch

HIDDEN, INTERMEDIATE, EXPERTS, RANK = 2048, 768, 128, 8  # Qwen3-30B-A3B's MoE; vLLM's warm-up rank
MAKINGS = 5


def make(layers: int) -> tuple[float, int, int]:
    """Seconds for one making over `layers` MoE layers, tensors made, bytes stacked."""
    from vllm.lora import lora_weights

    t0 = time.perf_counter()
    count = size = 0
    for layer in range(layers):
        name = f"model.layers.{layer}.mlp.experts"
        subloras = []
        for _ in range(EXPERTS):
            for k, n in ((HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)):  # w1, w2, w3
                subloras.append(
                    lora_weights.LoRALayerWeights.create_dummy_lora_weights(name, k, n, RANK, torch.bfloat16, "cpu")
                )
        packed = lora_weights.PackedLoRALayerWeights.pack_moe(subloras, name)
        count += 2 * len(subloras)
        size += sum(t.numel() * t.element_size() for t in (*packed.lora_a, *packed.lora_b) if t is not None)
    return time.perf_counter() - t0, count, size


def main() -> None:
    from vllm.lora import lora_weights

    print(f"pinned: {bool(getattr(lora_weights, 'PIN_MEMORY', False))}")
    print("| layers | tensors made | stacked GB | s per making (best of 3) | 5 makings s | 1 making s |")
    print("|---|---|---|---|---|---|")
    for layers in (8, 24, 48):
        runs = [make(layers) for _ in range(3)]
        best = min(seconds for seconds, _, _ in runs)
        _, count, size = runs[0]
        print(f"| {layers} | {count:,} | {size / 1e9:.3f} | {best:.2f} | {MAKINGS * best:.1f} | {best:.2f} |")


if __name__ == "__main__":
    main()
