"""The agent's loop with a peft fused-expert adapter (vLLM down): judged before the weights come, and prepared as
its per-expert rewrite, which is the path the agent will hand vLLM."""

from __future__ import annotations

import json
import pathlib

from moelora.agent.check import peft_moe
from moelora.agent.runner import Agent

from .conftest import BASE_MODEL, MemoryDesired, MemoryKube, adapter_files, eventually, upload
from .test_peft_moe import _peft_adapter


def test_unservable_target_parameters_fail_before_the_weights(
    agent: tuple[Agent, MemoryDesired, MemoryKube], s3_env: str, bucket: str
) -> None:
    loop, desired, kube = agent
    files = adapter_files(extra_bytes=1 << 20)
    config = json.loads(files["adapter_config.json"])
    files["adapter_config.json"] = json.dumps(dict(config, target_parameters=["mlp.router.weight"])).encode()
    upload(s3_env, bucket, "router/", files)
    desired.synced.set()
    desired.put("router", {"source": {"uri": f"s3://{bucket}/router/"}})
    eventually(lambda: "router" in kube.status and kube.status["router"][0].reason == "ConfigInvalid")
    assert not any(loop.settings.cache_dir.iterdir())


def test_fused_expert_adapter_is_prepared_as_its_rewrite(
    agent: tuple[Agent, MemoryDesired, MemoryKube], s3_env: str, bucket: str, tmp_path: pathlib.Path
) -> None:
    loop, desired, kube = agent
    made = tmp_path / "peft"
    _peft_adapter(made, hidden=16, inter=8)
    config = json.loads((made / "adapter_config.json").read_text())
    (made / "adapter_config.json").write_text(json.dumps(dict(config, base_model_name_or_path=BASE_MODEL)))
    upload(s3_env, bucket, "fused/", {p.name: p.read_bytes() for p in made.iterdir()})
    desired.synced.set()
    desired.put("fused", {"source": {"uri": f"s3://{bucket}/fused/"}})
    eventually(lambda: (r := loop.records.get("uid-fused")) is not None and r.path is not None)
    path = pathlib.Path(loop.records["uid-fused"].path)  # type: ignore[arg-type]
    assert path.name == peft_moe.CONVERTED_DIR and path.parent.parent == loop.settings.cache_dir
    assert (path / "adapter_model.safetensors").is_file()
    assert json.loads((path / "adapter_config.json").read_text())["target_parameters"] is None
    assert peft_moe.cache_version(str(path)) == path.parent.name
