"""The agent's memory: its RSS with 500 PEFT MoE adapters loaded, and across bursts of hostile adapters refused.

    .venv/bin/python benchmarks/agent_rss.py [--adapters 500] [--bursts 2] [--keep]

The agent runs as its own process (`python -m moelora.agent`, env only, as the pod runs it: the operator's malloc
settings, and the base model's config.json so every check runs) against the Kubernetes API emulator, moto's S3 and
the small fake vLLM of benchmarks/chaos_pods.py (vLLM's runtime LoRA API on loopback; the agent's memory does not
depend on what vLLM does with a load). Every adapter is a real peft adapter of a tiny generated Qwen3-MoE with fused
expert LoRA (`target_parameters`), so each one is checked value by value and rewritten per expert, the path that once
mapped torch into the agent. Each of the 500 is a distinct version (a variant file), so each is downloaded, checked
and rewritten. Then `--bursts` times: every hostile adapter of tests/e2e/test_hostile_adapters.py is created,
refused, and deleted. Then a second agent, whose base model is Qwen3-30B-A3B (a header may be as long as its 18,800
modules' tensors could need, 20 MB), refuses `--giants` adapters at once whose weights are the longest header it
parses (empty tensors, refused for their number): the most memory a file can make it spend. RSS is the agent's
VmRSS, sampled after each phase has settled; peak is its VmHWM. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import importlib.util
import json
import logging
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import kubernetes.client
import kubernetes.config

from moelora.agent.check import basemodel, validate
from moelora.local import moe, process
from moelora.local import s3 as local_s3
from moelora.local.apiserver import KubeAPI
from moelora.operator.render import deployment

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import values_check  # noqa: E402 - sibling scripts, not a package
from agent import agent_env, machine_line_and_cleanup  # noqa: E402
from chaos_pods import BASE, FakeVllm  # noqa: E402

NS, POD, SERVER = "rss", "srv-0", "srv"
ADAPTERS = "moelora.io/v1alpha1/loraadapters"
QWEN3_30B = "Qwen/Qwen3-30B-A3B"


def giant_header(size: int) -> bytes:
    """A safetensors file that is all header: empty tensors until the JSON is `size` bytes long."""
    entry = b'{"dtype":"F32","shape":[0,8],"data_offsets":[0,0]}'
    parts, total, i = [], 0, 0
    while total < size:
        part = b'"base_model.model.model.layers.%d.self_attn.q_proj.lora_A.weight":%s' % (i, entry)
        parts.append(part)
        total += len(part) + 1
        i += 1
    text = b"{" + b",".join(parts) + b"}"
    return len(text).to_bytes(8, "little") + text


def _module(path: pathlib.Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def memory_mib(pid: int) -> dict[str, float]:
    found = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


def entry(obj: dict[str, Any] | None) -> dict[str, Any]:
    return ((obj or {}).get("status") or {}).get("replicas", {}).get(POD, {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=500)
    parser.add_argument("--bursts", type=int, default=2)
    parser.add_argument("--giants", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (the agent's log)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    hostile = _module(HERE.parent / "tests" / "e2e" / "test_hostile_adapters.py")
    load_before = os.getloadavg()[0]
    work = pathlib.Path(tempfile.mkdtemp(prefix="moelora-agent-rss-"))
    s3 = local_s3.start_moto()
    fake = FakeVllm().start()
    rows: list[tuple[str, dict[str, float], str]] = []
    giants: list[tuple[str, dict[str, float], str]] = []
    try:
        model = moe.make_moe_model(path=work / "model")
        good = work / "peft"
        moe.make_moe_adapter(model_dir=model, path=work / "vllm-layout", peft_path=good, base_model_name=BASE)
        files = {p.name: p.read_bytes() for p in good.iterdir()}
        client = s3.client()
        local_s3.ensure_bucket(client=client, bucket="adapters")

        def upload(prefix: str, objects: dict[str, bytes]) -> None:
            for name, body in objects.items():
                client.put_object(Bucket="adapters", Key=f"{prefix}{name}", Body=body)

        with KubeAPI(namespace=NS) as api:

            def start_agent(base: str, config: pathlib.Path, server: str, log: str) -> tuple[Any, int]:
                port = process.free_port()
                env = agent_env(
                    api=api,
                    s3=s3,
                    namespace=NS,
                    pod=POD,
                    server=server,
                    base=base,
                    vllm_url=fake.url,
                    cache_dir=work / f"cache-{server}",
                    port=port,
                    MOELORA_BASE_MODEL_CONFIG=str(config),
                    MOELORA_POLL_SECONDS="1",
                    # As the operator renders the agent's container.
                    PYTHONMALLOC=deployment.AGENT_PYTHON_MALLOC,
                    MALLOC_ARENA_MAX=str(deployment.AGENT_MALLOC_ARENA_MAX),
                )
                argv = [sys.executable, "-m", "moelora.agent"]
                return process.spawn(argv=argv, env=env, log_path=work / log), port

            agent, port = start_agent(BASE, model / "config.json", SERVER, "agent.log")
            kube = kubernetes.config.new_client_from_config(config_file=str(api.kubeconfig))
            custom = kubernetes.client.CustomObjectsApi(kube)

            def create(name: str, prefix: str, server: str = SERVER) -> None:
                body = {
                    "apiVersion": "moelora.io/v1alpha1",
                    "kind": "LoRAAdapter",
                    "metadata": {"name": name},
                    "spec": {"modelServer": server, "source": {"uri": f"s3://adapters/{prefix}"}},
                }
                custom.create_namespaced_custom_object("moelora.io", "v1alpha1", NS, "loraadapters", body)

            def delete(name: str) -> None:
                custom.delete_namespaced_custom_object("moelora.io", "v1alpha1", NS, "loraadapters", name)

            def settle(names: set[str], done: Any, what: str) -> dict[str, dict[str, Any]]:
                start = time.monotonic()
                while time.monotonic() - start < args.timeout:
                    entries = {o["metadata"]["name"]: entry(o) for o in api.list(ADAPTERS, NS)}
                    if all(done(entries.get(n, {})) for n in names):
                        return entries
                    time.sleep(1.0)
                raise SystemExit(f"{what} did not settle in {args.timeout:.0f} s; see {work / 'agent.log'}")

            try:
                process.wait_http_ok(f"http://127.0.0.1:{port}/readyz", timeout=60, process=agent)
                time.sleep(2)
                rows.append(("started, no adapter", memory_mib(agent.pid), ""))

                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    list(
                        pool.map(
                            lambda i: upload(f"many/{i}/", {**files, "variant.txt": f"many-{i}".encode()}),
                            range(args.adapters),
                        )
                    )
                names = {f"many-{i:04d}" for i in range(args.adapters)}
                start = time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda i: create(f"many-{i:04d}", f"many/{i}/"), range(args.adapters)))
                settle(names, lambda e: e.get("loaded"), f"{args.adapters} adapters")
                took = time.monotonic() - start
                time.sleep(3)
                rows.append((f"{args.adapters} PEFT MoE adapters loaded", memory_mib(agent.pid), f"{took:.0f} s"))

                for burst in range(1, args.bursts + 1):
                    cases = hostile._hostile(good, work)
                    start = time.monotonic()
                    for name, (objects, _) in cases.items():
                        upload(f"{name}-{burst}/", objects)
                        create(f"{name}-{burst}", f"{name}-{burst}/")
                    burst_names = {f"{name}-{burst}" for name in cases}
                    entries = settle(burst_names, lambda e: e.get("state") == "Failed", f"burst {burst}")
                    reasons = collections.Counter(entries[n].get("reason") for n in burst_names)
                    took = time.monotonic() - start
                    for name in burst_names:
                        delete(name)
                    time.sleep(3)
                    summary = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
                    rows.append(
                        (
                            f"burst {burst}: {len(cases)} hostile adapters refused, then deleted",
                            memory_mib(agent.pid),
                            f"{took:.0f} s ({summary})",
                        )
                    )
                served = len(fake.adapters)
                agent.terminate()
                agent.wait(timeout=30)
                with fake.lock:
                    fake.adapters.clear()  # another pod's vLLM

                (work / "qwen3-30b").mkdir()
                (work / "qwen3-30b" / "config.json").write_text(json.dumps(values_check.QWEN3_30B_A3B))
                qwen3 = basemodel.from_config(values_check.QWEN3_30B_A3B)
                agent, port = start_agent(QWEN3_30B, work / "qwen3-30b" / "config.json", "big", "agent-big.log")
                process.wait_http_ok(f"http://127.0.0.1:{port}/readyz", timeout=60, process=agent)
                time.sleep(2)
                giants.append(("started (base model Qwen3-30B-A3B), no adapter", memory_mib(agent.pid), ""))
                longest = validate.ENTRY_BYTES * 2 * qwen3.module_count() + validate.METADATA_BYTES
                body = giant_header(longest - 1000)
                config = {
                    "peft_type": "LORA",
                    "r": 8,
                    "target_modules": ["q_proj"],
                    "base_model_name_or_path": QWEN3_30B,
                }
                for i in range(args.giants):
                    files = {"adapter_config.json": json.dumps(config).encode(), "adapter_model.safetensors": body}
                    upload(f"giant/{i}/", {**files, "variant.txt": f"giant-{i}".encode()})  # each its own version
                start = time.monotonic()
                for i in range(args.giants):
                    create(f"giant-{i}", f"giant/{i}/", server="big")
                entries = settle(
                    {f"giant-{i}" for i in range(args.giants)}, lambda e: e.get("state") == "Failed", "giants"
                )
                took = time.monotonic() - start
                time.sleep(3)
                reasons = collections.Counter(e.get("reason") for n, e in entries.items() if n.startswith("giant-"))
                summary = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
                giants.append(
                    (
                        f"{args.giants} adapters of a {len(body) / 1e6:.0f} MB header refused",
                        memory_mib(agent.pid),
                        f"{took:.0f} s ({summary})",
                    )
                )
            finally:
                kube.close()
                agent.terminate()
                agent.wait(timeout=30)
    finally:
        fake.stop()
        s3.stop()

    loaded_rss = rows[1][1]["VmRSS"]
    for table in (rows, giants):
        print("| phase | agent RSS | peak RSS so far | change | took |")
        print("|---|---|---|---|---|")
        previous = None
        for what, memory, took in table:
            change = "" if previous is None else f"{memory['VmRSS'] - previous:+.0f} MiB"
            print(f"| {what} | {memory['VmRSS']:.0f} MiB | {memory['VmHWM']:.0f} MiB | {change} | {took} |")
            previous = memory["VmRSS"]
        print()
    print(
        f"with {args.adapters} adapters: {loaded_rss:.0f} MiB (target < 150); across the bursts: "
        f"{rows[-1][1]['VmRSS'] - loaded_rss:+.0f} MiB, across the giant headers "
        f"{giants[-1][1]['VmRSS'] - giants[0][1]['VmRSS']:+.0f} MiB (target < 50); {served} adapters in the fake "
        "vLLM at the end"
    )
    machine_line_and_cleanup(work, keep=args.keep, load_before=load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
