"""What one decode step of the benchmark kit's models reads from GPU memory, with and without the adapters' LoRA.

Arithmetic from the shapes (bf16 weights and KV cache), for the load of compare.sh: `--tokens` sequences decoding
one token each, spread round-robin over `--adapters` adapters of rank `--rank` on attention and every expert. The
experts a step reads depend on the routing: `uniform` draws each token's top-k experts uniformly (vLLM's
`VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random`, with repeats), a number (`--experts 4.6`) says how many
experts a layer the router sends every token to (the kit's dummy weights send nearly every token to the same few).
A step's time is not its bytes over the bandwidth; the ratio says how much more a step with LoRA must read.

`--prompt 1600` adds a step with a new request's 1600 prompt tokens beside the decodes (one adapter's prefill), where
the LoRA's activation traffic (each routed row read and written again beside the GEMMs) outweighs its weights.

Usage: python benchmarks/vllm_e2e/step_bytes.py [--tokens 16] [--adapters 8] [--rank 32] [--context 1900] [--prompt N]
"""

from __future__ import annotations

import argparse
import dataclasses

import make_qwen3

BF16 = 2


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    experts: int
    top_k: int
    moe_intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    full_attention_layers: int  # the rest attend over a sliding window
    window: int


# The GPT-OSS kit's config.json (../shared/tools/vllm-h200/make_model_dir.py: every other layer a 128-token window).
GPT_OSS = Shape("GPT-OSS-20B", 24, 2880, 32, 4, 2880, 64, 8, 64, 201088, 12, 128)
_Q = make_qwen3.CONFIG  # the Qwen3 model the benchmark serves
QWEN3 = Shape(
    "Qwen3-30B-A3B",
    _Q["num_hidden_layers"],
    _Q["hidden_size"],
    _Q["num_experts"],
    _Q["num_experts_per_tok"],
    _Q["moe_intermediate_size"],
    _Q["num_attention_heads"],
    _Q["num_key_value_heads"],
    _Q["head_dim"],
    _Q["vocab_size"],
    _Q["num_hidden_layers"],
    0,
)


def distinct(draws: float, choices: int) -> float:
    """Expected number of distinct values among `draws` uniform draws (with repeats) from `choices`."""
    return choices * (1.0 - (1.0 - 1.0 / choices) ** draws)


def step_bytes(
    shape: Shape,
    tokens: int,
    adapters: int,
    rank: int,
    context: int,
    experts: float | None,
    prompt: int = 0,
    int8: bool = False,
) -> dict:
    """Bytes one step reads, by part: `tokens` sequences decoding and, with `prompt`, that many prompt tokens of one
    more sequence on one adapter (the benchmark's steady state: a new request's prefill beside the decodes).
    experts=None means uniform routing, else experts read a layer, every token routed among them. int8: the experts'
    LoRA weights as expert_int8 serves them, a byte each and a float32 scale per rank of each projection."""
    s = shape
    q, kv = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
    expert = 3 * s.hidden * s.moe_intermediate * BF16  # gate and up (w13) and down (w2)
    # One adapter's A and B on one expert's three projections.
    pair = (
        rank * 3 * (s.hidden + s.moe_intermediate) * BF16
        if not int8
        else rank * 3 * (s.hidden + s.moe_intermediate + 4)
    )
    attention = (s.hidden * (q + 2 * kv) + q * s.hidden) * BF16
    attention_lora = adapters * rank * (3 * s.hidden + (q + 2 * kv) + q + s.hidden) * BF16  # q/k/v A each, o's A

    def reach(draws: float) -> float:
        """Experts that this many routed slots touch."""
        return distinct(draws, s.experts) if experts is None else min(experts, draws)

    read = reach((tokens + prompt) * s.top_k)
    # Each adapter's decoding tokens reach their experts; the prompt's adapter reaches more with its prompt.
    per_adapter = tokens / adapters
    pairs = (adapters - 1) * reach(per_adapter * s.top_k) + reach((per_adapter + prompt) * s.top_k)
    sliding = s.layers - s.full_attention_layers
    kv_tokens = tokens * (s.full_attention_layers * context + sliding * min(context, s.window))
    base = {
        "experts": s.layers * read * expert,
        "attention": s.layers * attention,
        "lm_head": s.vocab * s.hidden * BF16,
        "KV cache": kv_tokens * 2 * kv * BF16,
    }
    # Rows each routed pair moves: the base GEMMs and activation read and write each once; the LoRA, apart from the
    # GEMMs, reads the inputs again (shrinks) and reads and writes the outputs again (expands). Small at decode only.
    routed = (tokens + prompt) * s.top_k
    h, i = s.hidden, s.moe_intermediate
    base["MoE activations"] = s.layers * routed * (h + 2 * i + 2 * i + i + i + h) * BF16
    lora = {
        "MoE LoRA": s.layers * pairs * pair,
        "attention LoRA": s.layers * attention_lora,
        "MoE LoRA activations": s.layers * routed * (h + 2 * (2 * i) + i + 2 * h) * BF16,
        "attention LoRA activations": s.layers * (tokens + prompt) * 2 * (q + 2 * kv + s.hidden) * BF16,
    }
    return {"experts a layer": read, "pairs a layer": pairs, "base": base, "lora": lora}


def table(rows: list[tuple[Shape, str, dict]]) -> str:
    out = [
        "| model | routing | experts a layer | (adapter, expert) pairs a layer | base GB | LoRA GB | LoRA / base |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, routing, r in rows:
        base, lora = sum(r["base"].values()) / 1e9, sum(r["lora"].values()) / 1e9
        out.append(
            f"| {shape.name} | {routing} | {r['experts a layer']:.1f} | {r['pairs a layer']:.1f} | {base:.1f} "
            f"| {lora:.2f} | +{100 * lora / base:.1f}% |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--context", type=int, default=1900, help="tokens a sequence attends over")
    ap.add_argument("--experts", type=float, action="append", help="experts a layer, collapsed router")
    ap.add_argument("--prompt", type=int, action="append", help="also a step with this many prompt tokens")
    ap.add_argument("--int8", action="store_true", help="the experts' LoRA weights in int8 (expert_int8)")
    a = ap.parse_args()
    rows = []
    for shape in (GPT_OSS, QWEN3):
        for experts in [None, *(a.experts or [])]:
            routing = "uniform" if experts is None else f"{experts:g} experts"
            for prompt in [0, *(a.prompt or [])]:
                label = routing + (f", {prompt} prompt tokens" if prompt else "")
                rows.append(
                    (shape, label, step_bytes(shape, a.tokens, a.adapters, a.rank, a.context, experts, prompt, a.int8))
                )
    print(table(rows))


if __name__ == "__main__":
    main()
