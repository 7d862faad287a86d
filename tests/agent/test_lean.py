"""The agent stays lean: checking a PEFT MoE adapter and rewriting its fused experts per expert, as the agent does
before vLLM loads it, maps neither torch nor any other part of the serving stack into the agent's process."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from moelora.local import moe

BASE = "moelora/tiny-qwen3-moe"
HEAVY = ("torch", "safetensors", "transformers", "vllm", "triton", "peft")

CHILD = r"""
import json, pathlib, sys

def rss_mib():
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

import moelora.agent.__main__, moelora.agent.runner  # everything the pod's agent imports
from moelora.agent.check import peft_moe
from moelora.agent.check.validate import Limits, validate

adapter, base_config = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
before = rss_mib()
limits = Limits(base_model=sys.argv[3], max_rank=16, target_modules=frozenset(), max_bytes=1 << 30,
                base_config=base_config)
info = validate(adapter, limits)
served = peft_moe.servable(adapter, base_model=sys.argv[3])
validate(served, limits)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[4].split(","))
print(json.dumps({"served": str(served), "rank": info.rank, "heavy": heavy, "grew_mib": rss_mib() - before}))
"""


@pytest.fixture(scope="module")
def peft_moe_adapter(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    root = tmp_path_factory.mktemp("lean")
    model = moe.make_moe_model(path=root / "model")
    moe.make_moe_adapter(
        model_dir=model, path=root / "vllm-layout", peft_path=root / "peft", base_model_name=BASE, rank=8
    )
    return root / "peft", model / "config.json"


def test_checking_and_rewriting_a_peft_moe_adapter_loads_no_torch(
    peft_moe_adapter: tuple[pathlib.Path, pathlib.Path],
) -> None:
    adapter, base_config = peft_moe_adapter
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["target_parameters"]  # peft's fused-expert format: the agent rewrites it
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(adapter), str(base_config), BASE, ",".join(HEAVY)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["served"] == str(adapter / "vllm-per-expert") and result["rank"] == 8
    assert result["heavy"] == []
    assert result["grew_mib"] < 50, result
