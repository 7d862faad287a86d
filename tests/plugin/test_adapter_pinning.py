"""adapter_pinning: a loaded adapter's weights copied into one buffer, on vLLM's own LoRA objects.

The adapters are make_qwen3's PEFT layout (per-expert pairs, as the Qwen3 benchmark loads them) at a small shape,
read by the installed vLLM's `LoRAModel.from_local_checkpoint` and merged by its own `PackedLoRALayerWeights` packers.
The CPU has no pinned memory, so the buffer here is a plain one (the plugin's allocator is the only difference).
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

from moelora.vllm_plugin import adapter_pinning
from moelora.vllm_plugin.patches import Patches

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks" / "vllm_e2e"))
import adapter_load  # noqa: E402
import make_qwen3  # noqa: E402

SMALL = make_qwen3.SMALL
RANK = 4
# What vLLM's manager does with these modules (q/k/v into qkv_proj, each layer's experts into stacked tensors), as
# the benchmark of this part does it.
merge = adapter_load.merge


def plain(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("pinning")
    make_qwen3.write_loras(root, 1, RANK, config=SMALL)
    return root / "lora1"


def load(adapter_dir: pathlib.Path):
    """vLLM's reading of the adapter (its worker passes device "cpu" and the LoRA dtype)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    expected = adapter_load.expected_modules(adapter_dir)
    helper = PEFTHelper.from_local_dir(str(adapter_dir), max_position_embeddings=None)
    return LoRAModel.from_local_checkpoint(
        str(adapter_dir), expected, helper, lora_model_id=7, device="cpu", dtype=torch.bfloat16
    )


def tensors(model) -> dict[tuple[str, str, int], torch.Tensor]:
    out = {}
    for name, weights in model.loras.items():
        for attr in ("lora_a", "lora_b"):
            value = getattr(weights, attr)
            for i, t in enumerate(value if isinstance(value, list) else [value]):
                if t is not None:
                    out[name, attr, i] = t
    return out


def test_every_weight_becomes_a_view_of_one_buffer_with_vllms_values(adapter_dir):
    model = load(adapter_dir)
    merge(model)
    before = {k: t.clone() for k, t in tensors(model).items()}
    buffers = []

    def allocate(nbytes: int) -> torch.Tensor:
        buffers.append(plain(nbytes))
        return buffers[-1]

    nbytes, count = adapter_pinning.pack_into_one_buffer(model, allocate)
    after = tensors(model)
    assert len(buffers) == 1 and nbytes == buffers[0].numel()
    assert set(after) == set(before) and count == len(before)  # every module's a and b, each list entry
    payload = sum(t.numel() * t.element_size() for t in before.values())
    assert payload <= nbytes < payload + 256 * count
    base = buffers[0].untyped_storage().data_ptr()
    for key, t in after.items():
        assert t.untyped_storage().data_ptr() == base, key
        assert t.dtype == before[key].dtype and t.shape == before[key].shape, key
        assert torch.equal(t, before[key]), key
    # The stacked experts are what the GPU copy reads: (num_experts, rank, in) and (num_experts, out, rank).
    w1_a = after["model.layers.1.mlp.experts", "lora_a", 0]
    assert w1_a.shape == (SMALL["num_experts"], RANK, SMALL["hidden_size"]) and w1_a.is_contiguous()


def test_a_tensor_held_under_two_names_is_copied_once():
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.lora_weights import PackedLoRALayerWeights

    shared, down = torch.randn(3, 4, 16), torch.randn(3, 4, 8)
    b = [torch.randn(3, 8, 4), torch.randn(3, 16, 4), torch.randn(3, 8, 4)]
    # vLLM's 3D -> 2D conversion hands one gate_up lora_a to both w1 and w3; GPT-OSS's keeps it under two modules.
    packed = PackedLoRALayerWeights("m.experts", 4, [8, 8, 8], [shared, down, shared], b)
    alias = PackedLoRALayerWeights("m.experts.base_layer", 4, [8], [shared.view(3, 4, 16)], [b[0]])
    model = LoRAModel(1, 4, {"m.experts": packed, "m.experts.base_layer": alias})
    nbytes, count = adapter_pinning.pack_into_one_buffer(model, plain)
    assert count == 5
    assert packed.lora_a[0] is packed.lora_a[2] is alias.lora_a[0] and torch.equal(packed.lora_a[0], shared)
    assert alias.lora_b[0] is packed.lora_b[0]
    assert packed.lora_a[0].data_ptr() != packed.lora_a[1].data_ptr()


def test_tensors_already_pinned_are_left_alone(adapter_dir, monkeypatch):
    """vLLM creates its warm-up dummies' weights pinned, and its clones of a dummy share them: no copy of those."""
    model = load(adapter_dir)
    merge(model)
    before = tensors(model)
    held = {id(t) for k, t in before.items() if k[0].endswith("mlp.experts")}
    monkeypatch.setattr(adapter_pinning, "_pinned_already", lambda t: id(t) in held)
    nbytes, count = adapter_pinning.pack_into_one_buffer(model, plain)
    after = tensors(model)
    assert count == len(before) - len(held) > 0
    assert all((after[k] is t) == (id(t) in held) for k, t in before.items())
    monkeypatch.setattr(adapter_pinning, "_pinned_already", lambda t: True)
    assert adapter_pinning.pack_into_one_buffer(model, plain) == (0, 0)


def test_a_failed_allocation_leaves_the_adapter_as_vllm_merged_it(adapter_dir, plugin_log):
    model = load(adapter_dir)
    merge(model)
    before = tensors(model)

    def refuse(nbytes: int) -> torch.Tensor:
        raise RuntimeError("CUDA error: out of memory (host)")

    adapter_pinning._pin(model, refuse)
    after = tensors(model)
    assert all(after[k] is before[k] for k in before)
    assert any("adapter 7 left unpinned" in line and "out of memory" in line for line in plugin_log)


def test_install_turns_vllms_two_passes_off_wraps_its_merge_and_comes_off(adapter_dir, monkeypatch, plugin_log):
    import vllm.lora.lora_model as lora_model_module
    import vllm.lora.model_manager as manager_module

    monkeypatch.setattr(manager_module, "PIN_MEMORY", True)  # as on CUDA; the CPU has no pinned memory
    monkeypatch.setattr(lora_model_module, "PIN_MEMORY", True)
    original = manager_module.LoRAModelManager._create_merged_loras_inplace
    patches = Patches()
    assert adapter_pinning.install_adapter_pinning(patches, allocate=plain) is None
    try:
        assert manager_module.PIN_MEMORY is False and lora_model_module.PIN_MEMORY is False
        model = load(adapter_dir)  # from_lora_tensors pinned nothing: it would have raised on the CPU
        scaling = {name: w.scaling for name, w in model.loras.items()}
        raw = {name: w.lora_b.clone() for name, w in model.loras.items()}
        # vLLM's own merge, on a manager with no modules to merge: it folds each scaling into lora_b, then ours runs.
        manager = object.__new__(manager_module.LRUCacheLoRAModelManager)
        manager.packed_modules, manager.modules = {}, {}
        manager._create_merged_loras_inplace(model)
        storages = {t.untyped_storage().data_ptr() for t in tensors(model).values()}
        assert len(storages) == 1
        for name, weights in model.loras.items():
            assert torch.equal(weights.lora_b, (raw[name] * scaling[name]).to(weights.lora_b.dtype)), name
        assert any("adapter 7 pinned in one buffer" in line for line in plugin_log)
    finally:
        patches.undo()
    assert manager_module.PIN_MEMORY is True and lora_model_module.PIN_MEMORY is True
    assert manager_module.LoRAModelManager._create_merged_loras_inplace is original


def test_install_is_skipped_where_vllm_pins_nothing_or_when_switched_off(monkeypatch):
    import vllm.lora.model_manager as manager_module

    patches = Patches()
    monkeypatch.setattr(manager_module, "PIN_MEMORY", False)
    assert adapter_pinning.install_adapter_pinning(patches) == "vLLM pins no host memory on this platform"
    monkeypatch.setattr(manager_module, "PIN_MEMORY", True)
    monkeypatch.setenv(adapter_pinning.ENV, "0")
    assert adapter_pinning.install_adapter_pinning(patches) == f"{adapter_pinning.ENV}=0"
    assert patches.done == []
