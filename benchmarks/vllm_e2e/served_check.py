"""What a served model answers, to compare two servers of one model and adapters (the plugin's LoRA kernels against
stock vLLM's) where `bench serve` checks nothing.

`collect` asks each model (the base and each adapter) for greedy continuations with their top logprobs, by token id:
prompts one at a time, long enough that the prefill step runs the plugin's LoRA above lora_stream's bound, then a
burst of concurrent short prompts whose decode steps run dense split K and the MoE-LoRA decode path.
`compare` lines up two such files: for each model, how often the servers' greedy tokens agree and the largest
difference of a logprob both list at a position, beside the same figures for that adapter against the base model on
each server. An adapter served wrong (or not at all) disagrees across servers about as much as it does with the base.
A model whose top logprobs are flat (vLLM's dummy weights give every token about the same logprob, so greedy tokens
are ties decided by rounding) proves nothing either way: `compare` says so and fails.

Usage: served_check.py collect URL OUT.json --models base,lora1,... [--vocab N] [--long N,N]
       served_check.py compare A.json B.json [--bound 0.1]   (exit 1 when a model's first tokens differ across the
       servers or its logprobs by more than the bound)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import sys
import urllib.request

LONG = (1100, 1500)  # prompt lengths above the plugin's default bound of 1024 tokens, one request at a time
BURST, SHORT = 16, 40  # concurrent requests and their prompt length: decode steps of 16 sequences
MAX_TOKENS, TOP = 8, 5
FLAT = 1e-3  # top logprobs closer than this at a position: the greedy token is a tie, not an answer

Answer = dict  # {"tokens": [id, ...], "top": [{id: logprob, ...}, ...]}


def prompts(vocab: int, long: tuple[int, ...] = LONG, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(100, vocab) for _ in range(n)]  # noqa: E731  (above the special tokens)
    return [ids(n) for n in long], [ids(SHORT) for _ in range(BURST)]


def ask(url: str, model: str, prompt: list[int]) -> Answer:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": TOP,
        "return_tokens_as_token_ids": True,
    }
    request = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        logprobs = json.load(response)["choices"][0]["logprobs"]
    token_id = lambda key: int(key.split(":", 1)[1])  # noqa: E731  ("token_id:N")
    return {
        "tokens": [token_id(t) for t in logprobs["tokens"]],
        "top": [{token_id(k): v for k, v in (top or {}).items()} for top in logprobs["top_logprobs"]],
    }


def collect(url: str, models: list[str], vocab: int, long: tuple[int, ...] = LONG) -> dict[str, list[Answer]]:
    long_prompts, burst = prompts(vocab, long)
    out: dict[str, list[Answer]] = {}
    with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
        for model in models:
            answers = [ask(url, model, p) for p in long_prompts]
            answers += list(pool.map(lambda p, m=model: ask(url, m, p), burst))
            out[model] = answers
    return out


def agreement(a: list[Answer], b: list[Answer]) -> tuple[float, float, float]:
    """Over pairs of answers to the same prompt: the share whose first greedy token is the same, the share whose
    every token is, and the largest |logprob difference| of a token both list at a position (each pair up to and
    including the first position where their greedy tokens part)."""
    first = whole = 0
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        first += x["tokens"][:1] == y["tokens"][:1]
        whole += x["tokens"] == y["tokens"]
        for tx, ty, px, py in zip(x["tokens"], y["tokens"], x["top"], y["top"], strict=False):
            worst = max([worst, *(abs(px[t] - py[t]) for t in set(px) & set(py))])
            if tx != ty:
                break
    return first / len(a), whole / len(a), worst


def flat_share(answers: list[Answer]) -> float:
    """The share of positions whose listed top logprobs all lie within FLAT of each other."""
    spreads = [max(top.values()) - min(top.values()) for a in answers for top in a["top"] if len(top) > 1]
    return sum(s < FLAT for s in spreads) / max(len(spreads), 1)


def compare(a: dict, b: dict, bound: float) -> tuple[list[str], bool]:
    """A table of each model's agreement across the two servers, beside how far it moves from the base model on
    each server; ok when every model's first tokens agree across servers and its logprobs within `bound`, and the
    answers are not ties (flat top logprobs at most positions make agreement meaningless)."""
    base = next(iter(a))  # collect's first model is the base one
    lines = [
        "| model | A = B: first token / all tokens / largest logprob difference | A: model = base | B: model = base |",
        "|---|---|---|---|",
    ]
    ok = True
    show = lambda r: f"{r[0]:.2f} / {r[1]:.2f} / {r[2]:.4f}"  # noqa: E731
    for model in a:
        across = agreement(a[model], b[model])
        ok &= across[0] == 1.0 and across[2] <= bound
        own = ("-", "-") if model == base else (show(agreement(a[model], a[base])), show(agreement(b[model], b[base])))
        lines.append(f"| {model} | {show(across)} | {own[0]} | {own[1]} |")
    flat = max(flat_share(answers) for answers in [*a.values(), *b.values()])
    if flat > 0.5:
        ok = False
        lines.append(
            f"\ninconclusive: at {flat:.0%} of one model's positions the top {TOP} logprobs lie within {FLAT} of each"
            " other, so its greedy tokens are ties (dummy weights?), and agreement above says nothing"
        )
    return lines, ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("url")
    c.add_argument("out")
    c.add_argument("--models", required=True, help="comma-separated, the base model first")
    c.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below this")
    c.add_argument("--long", default=",".join(map(str, LONG)), help="lengths of the prompts sent one at a time")
    k = sub.add_parser("compare")
    k.add_argument("a")
    k.add_argument("b")
    k.add_argument("--bound", type=float, default=0.1, help="the largest logprob difference allowed")
    args = parser.parse_args(argv)
    if args.command == "collect":
        with open(args.out, "w") as f:
            long = tuple(int(n) for n in args.long.split(","))
            json.dump(collect(args.url, args.models.split(","), args.vocab, long), f)
        return 0
    with open(args.a) as fa, open(args.b) as fb:
        lines, ok = compare(json.load(fa), json.load(fb), args.bound)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
