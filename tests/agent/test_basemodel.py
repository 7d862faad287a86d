"""Where the agent reads the base model's config: a fixed path, or a hub snapshot found once vLLM downloaded it."""

from __future__ import annotations

import json
import pathlib

import pytest

from moelora.agent.check import basemodel
from moelora.agent.errors import TransientError

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}


def test_a_hub_snapshot_is_found_by_its_glob(tmp_path: pathlib.Path) -> None:
    pattern = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "*" / "config.json"
    with pytest.raises(TransientError, match="not there yet"):
        basemodel.for_checks(pattern)  # vLLM has not downloaded it yet: retried, not failed
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA))
    found = basemodel.for_checks(pattern)
    assert found is not None and found == basemodel.for_checks(snapshot / "config.json")
