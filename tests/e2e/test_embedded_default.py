"""`python -m moelora.local` runs the whole stack on the tiny MoE (through the moelora plugin), answers with each model
like transformers+peft, prints a status table, and on Ctrl-C stops everything it started."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from moelora.local import models

pytestmark = pytest.mark.slow
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "local"


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def test_embedded_default(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "local"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "moelora.local", "--dir", str(root), "--manifests", str(EXAMPLES)),
            *("--prompt", "hello world", "--max-tokens", "8"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 420
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Press Ctrl-C to stop" in line or time.monotonic() > deadline:
                break
        output = "".join(lines)
        assert "Press Ctrl-C to stop" in output, output
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output += rest
    assert proc.returncode == 0, output
    assert "stopped; everything it started has exited" in output

    for step in ("starting the Kubernetes API emulator", "kubectl apply -f", "alpha: Loaded on 1 pod(s)"):
        assert step in output
    model_dir = root / "model"
    want = models.reference_completions(
        model_dir=model_dir,
        adapter_dirs=[None, root / "adapters" / "alpha-peft", root / "adapters" / "beta-peft"],
        prompt="hello world",
        max_tokens=8,
    )
    assert len({c.token_ids for c in want}) == 3
    for name, completion in zip(("tiny-moe", "alpha", "beta"), want):
        assert f"{name:12} -> {completion.text!r}" in output
    table = [line.split() for line in output.splitlines() if line.startswith(("LoRAAdapter", "ModelServer"))]
    assert ["LoRAAdapter", "alpha", "Loaded", "1/1", "pods", "8"] in table
    assert ["LoRAAdapter", "beta", "Loaded", "1/1", "pods", "8"] in table
    assert not _processes_mentioning(str(root))  # vLLM, its engine core and the agent are all gone
