"""The Qwen3-30B-A3B-shaped benchmark model and adapters (benchmarks/vllm_e2e/make_qwen3.py): the shape is the one
the operator tunes and mounts configs for, the tokenizer round-trips every id, and every adapter tensor is one vLLM's
own parser maps to an attention projection or one expert's gate, up or down projection, with PEFT's shapes."""

import json
import pathlib
import re
import sys

import pytest

from moelora.operator.render import model_shapes

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks" / "vllm_e2e"))
import make_qwen3  # noqa: E402

SMALL = make_qwen3.SMALL


def test_the_model_is_the_shape_the_operator_knows():
    shape = model_shapes.known_shape("Qwen/Qwen3-30B-A3B")
    c = make_qwen3.CONFIG
    assert shape is not None
    assert (c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]) == (
        shape.hidden_size,
        shape.moe_intermediate_size,
        shape.num_experts,
    )


def test_the_tokenizer_round_trips_ids(tmp_path):
    from transformers import AutoTokenizer

    make_qwen3.write_model(tmp_path, config=SMALL)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3MoeForCausalLM"]
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = [0, 17, 151642, 151643, 151645, 151900]
    assert tok(tok.decode(ids), add_special_tokens=False)["input_ids"] == ids


def test_adapters_name_what_vllm_maps_onto_its_layers(tmp_path):
    from safetensors import safe_open
    from vllm.lora.utils import parse_fine_tuned_lora_name

    rank = 4
    params = make_qwen3.write_loras(tmp_path, 3, rank, config=SMALL)
    first = tmp_path / "lora1" / "adapter_model.safetensors"
    assert (tmp_path / "lora3" / "adapter_model.safetensors").stat().st_ino == first.stat().st_ino  # hard links
    expert = re.compile(r"model\.layers\.(\d)\.mlp\.experts\.(\d)\.(gate_proj|up_proj|down_proj)")
    attention = re.compile(r"model\.layers\.(\d)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)")
    seen = set()
    with safe_open(str(first), framework="pt") as f:
        total = 0
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            module, is_a = parse_fine_tuned_lora_name(key)
            shape = tuple(f.get_tensor(key).shape)
            total += f.get_tensor(key).numel()
            if m := expert.fullmatch(module):
                din, dout = (8, 16) if m[3] == "down_proj" else (16, 8)
            else:
                m = attention.fullmatch(module)
                assert m, key
                din, dout = {"q_proj": (16, 16), "k_proj": (16, 8), "v_proj": (16, 8), "o_proj": (16, 16)}[m[2]]
            assert shape == ((rank, din) if is_a else (dout, rank)), key
            seen.add((module, is_a))
    assert len(seen) == 2 * 2 * (4 + 3 * 3) and total == params  # layers x (A, B) x (attention + experts x 3)
    config = json.loads((tmp_path / "lora2" / "adapter_config.json").read_text())
    assert config["r"] == rank and {"gate_proj", "up_proj", "down_proj"} <= set(config["target_modules"])


def test_layers_cut_the_depth_and_nothing_else():
    cut = make_qwen3.with_layers(1, SMALL)
    assert cut["num_hidden_layers"] == 1
    assert {k: v for k, v in cut.items() if k != "num_hidden_layers"} == {
        k: v for k, v in SMALL.items() if k != "num_hidden_layers"
    }
    assert {int(name.split(".")[4]) for name in make_qwen3.adapter_shapes(cut, 4)} == {0}
    assert make_qwen3.with_layers(None) is make_qwen3.CONFIG


def test_the_command_line_passes_layers_to_model_and_adapters(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(make_qwen3, "write_model", lambda out, config: seen.append(config["num_hidden_layers"]))
    monkeypatch.setattr(
        make_qwen3,
        "write_loras",
        lambda out, count, rank, *, config, device: seen.append(config["num_hidden_layers"]) or 1,
    )
    make_qwen3.main(["model", str(tmp_path), "--layers", "24"])
    make_qwen3.main(["loras", str(tmp_path), "8", "32", "--layers", "24"])
    make_qwen3.main(["model", str(tmp_path)])
    assert seen == [24, 24, 48]
    with pytest.raises(SystemExit):
        make_qwen3.main(["model", str(tmp_path), "--layers", "49"])
    assert seen == [24, 24, 48]
