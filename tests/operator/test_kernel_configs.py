from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from moelora.api.kernel_table import KernelTable
from moelora.operator.errors import SpecProblem
from moelora.operator.render import kernel_configs as kc

from .conftest import k8s_valid, make_spec
from .kernel_bundles import (
    DENSE_FILES,
    GPT_OSS,
    QWEN3,
    SHAPES,
    TABLE_KEYS,
    VLLM_FILES,
    dense_tree,
    table_entry,
    vllm_leaves,
    write_bundle,
)

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
LABELS = {"app.kubernetes.io/managed-by": "moelora"}


@pytest.fixture
def bundle(tmp_path: pathlib.Path) -> pathlib.Path:
    return write_bundle(tmp_path)


def shape_of(model: str) -> object:
    return kc.model_shapes.model_shape(make_spec(model={"name": model}))


def auto_spec(model: str = GPT_OSS, **overrides: object) -> object:
    wire: dict[str, object] = {"model": {"name": model}, "kernels": {"configs": "auto"}, "nodeSelector": H200}
    return make_spec(**{**wire, **overrides})


def mounted(volume: kc.KernelConfigVolume | None) -> dict[str, object]:
    """{file name as vLLM sees it: parsed JSON} of an `auto` volume."""
    assert volume is not None and volume.owned_config_map is not None
    return {item["path"]: json.loads(volume.owned_config_map["data"][item["key"]]) for item in volume.items or []}


def pop_dense(files: dict[str, object], bundled: pathlib.Path, model: str = GPT_OSS) -> None:
    """Take the dense-op files out of `files`, checking they are there and whole (as bundled, not cut) for GPT-OSS,
    whose hidden size they were tuned with, and absent for another model."""
    for name in DENSE_FILES:
        if model == GPT_OSS:
            assert files.pop(name) == json.loads((bundled / name).read_text()), name
        else:
            assert name not in files, f"{name}, tuned for GPT-OSS' attention, mounted for {model}"


def pop_base(files: dict[str, object], model: str) -> list[str]:
    """Take vLLM's base fused-MoE files out of `files`, checking each is the model's (E, N); their names."""
    _, inter, experts = SHAPES[model]
    names = [name for name in files if kc.base_moe_shape(name) is not None]
    for name in names:
        assert kc.base_moe_shape(name) == (experts, inter), f"{name} mounted for {model}"
        files.pop(name)
    return names


def assert_only_shape(files: dict[str, object], model: str) -> None:
    hidden, inter, _ = SHAPES[model]
    pop_base(files, model)
    table = files.pop("NVIDIA_H200.json")
    assert isinstance(table, dict) and table["device"] == "NVIDIA H200"
    keys = {(e["k"], e["n"], e["num_experts"]) for e in table["entries"]}
    assert keys and keys <= TABLE_KEYS[model]
    assert files, "no vLLM file mounted"
    for file_name, tree in files.items():
        leaves = vllm_leaves(tree)
        assert leaves, file_name
        assert {(path[4], path[5]) for path in leaves} <= {(str(hidden), str(inter)), (str(hidden), str(2 * inter))}


@pytest.mark.parametrize(
    ("product", "device"),
    [
        ("NVIDIA-H200", "NVIDIA_H200"),
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA A100", "NVIDIA_A100"),
    ],
)
def test_device_name_is_vllms_form(product: str, device: str) -> None:
    assert kc.device_name({"nvidia.com/gpu.product": product}) == device
    assert kc.device_name({}) is None


def test_none_mode_has_no_volume(bundle: pathlib.Path) -> None:
    assert kc.volume(make_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle) is None


def test_auto_renders_an_owned_config_map_of_the_models_files(bundle: pathlib.Path) -> None:
    volume = kc.volume(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert volume is not None and volume.owned_config_map is not None
    k8s_valid(volume.owned_config_map)
    assert volume.config_map_name == "srv-kernel-configs"
    assert volume.owned_config_map["metadata"]["labels"] == LABELS
    paths = {item["key"]: item["path"] for item in volume.items or []}
    # The W2 expand file holds Qwen3 entries only: nothing of it is GPT-OSS', so it is not mounted; the dense-op
    # files are, whole.
    assert paths == {name: name for name in ("NVIDIA_H200.json", *VLLM_FILES[:2], *DENSE_FILES)}
    assert set(volume.owned_config_map["data"]) == set(paths)


@pytest.mark.parametrize("model", [GPT_OSS, QWEN3, "qwen/qwen3-30b-a3b-instruct-2507", "OpenAI/GPT-OSS-20B"])
def test_auto_mounts_only_the_models_shape(bundle: pathlib.Path, model: str) -> None:
    files = mounted(kc.volume(auto_spec(model), name="srv", namespace="ns", labels=LABELS, root=bundle))
    canonical = GPT_OSS if "gpt" in model.lower() else QWEN3
    pop_dense(files, bundle / "NVIDIA_H200", canonical)
    assert_only_shape(files, canonical)
    assert len(files) == (2 if canonical == GPT_OSS else 3)  # vLLM files left after the table was popped


@pytest.mark.parametrize("model", [GPT_OSS, QWEN3])
def test_the_real_bundle_is_cut_to_the_models_shape(model: str) -> None:
    root = kc.bundle_root()
    assert root is not None
    files = mounted(kc.volume(auto_spec(model), name="srv", namespace="ns", labels=LABELS, root=root))
    pop_dense(files, pathlib.Path(str(root)) / "NVIDIA_H200", model)
    assert len(pop_base(files, model)) == 1  # the bundled base fused-MoE file of this model, and no other's
    other = str(SHAPES[QWEN3 if model == GPT_OSS else GPT_OSS][0])
    assert not any(other in path[4] for tree in files.values() if "entries" not in tree for path in vllm_leaves(tree))
    assert_only_shape(files, model)


def test_the_real_dense_files_are_mounted_whole() -> None:
    """vLLM's dense LoRA-op files (attention and router projections, keyed by sizes the MoE shape does not carry;
    vLLM takes the nearest key at each level) go with GPT-OSS' fused ones on the H200, unchanged."""
    root = kc.bundle_root()
    assert root is not None
    volume = kc.volume(auto_spec(GPT_OSS), name="srv", namespace="ns", labels=LABELS, root=root)
    files = mounted(volume)
    assert set(DENSE_FILES) <= set(files) and any(name.startswith("NVIDIA_H200_FUSED_MOE_LORA_") for name in files)
    for name in DENSE_FILES:
        assert files[name] == json.loads((pathlib.Path(str(root)) / "NVIDIA_H200" / name).read_text())


def test_dense_files_are_kept_whole_by_their_exact_names(bundle: pathlib.Path) -> None:
    gpu = bundle / "NVIDIA_H200"
    (gpu / "NVIDIA_H200_EXPAND_FALSE.json").write_text(json.dumps(dense_tree(16, 2880)))
    (gpu / "NVIDIA_H100_SHRINK.json").write_text(json.dumps(dense_tree(2880, 16)))  # another GPU's name
    (gpu / "MY_NVIDIA_H200_SHRINK.json").write_text(json.dumps(dense_tree(2880, 16)))
    files = mounted(kc.volume(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle))
    # Not exactly a dense file's name: cut like a fused file, where they have no leaves of GPT-OSS' sizes.
    assert set(files) == {"NVIDIA_H200.json", *VLLM_FILES[:2], *DENSE_FILES, "NVIDIA_H200_EXPAND_FALSE.json"}
    assert files["NVIDIA_H200_EXPAND_FALSE.json"] == dense_tree(16, 2880)
    cut = kc.for_shape(kc.read_bundle("NVIDIA_H200", root=bundle), shape_of(GPT_OSS), gpu="NVIDIA_H200")
    assert cut["NVIDIA_H200_SHRINK.json"] == json.dumps(dense_tree(2880, 16), indent=1) + "\n"  # as bundled files


def test_dense_files_count_toward_a_config_maps_limit(bundle: pathlib.Path) -> None:
    shrink = bundle / "NVIDIA_H200" / DENSE_FILES[0]
    tree = dense_tree(2880, 16)
    tree["5"]["3"]["1"]["2880"]["16"]["pad"] = "x" * (kc.MAX_CONFIG_BYTES - 1024)
    shrink.write_text(json.dumps(tree))
    cut = kc.for_shape(kc.read_bundle("NVIDIA_H200", root=bundle), shape_of(GPT_OSS), gpu="NVIDIA_H200")
    size = {name: len(text.encode()) for name, text in cut.items()}
    assert size[DENSE_FILES[0]] <= kc.MAX_CONFIG_BYTES < sum(size.values())  # under the limit alone, not in all
    with pytest.raises(SpecProblem) as caught:
        kc.volume(auto_spec(GPT_OSS), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "KernelConfigsTooLarge"


def test_every_bundled_entry_belongs_to_a_known_model() -> None:
    """The bundle and model_shapes.KNOWN_SHAPES stay in step, so KernelConfigsNotFound lists every bundled shape."""
    root = kc.bundle_root()
    assert root is not None
    for gpu in sorted(p.stem for p in pathlib.Path(str(root)).glob("*.json")):
        bundle = kc.read_bundle(gpu, root=root)
        dense = {name: bundle.pop(name) for name in kc.dense_file_names(gpu) if name in bundle}  # mounted whole
        known = {(s.num_experts, s.moe_intermediate_size) for s in kc.model_shapes.KNOWN_SHAPES.values()}
        for name in [name for name in bundle if kc.base_moe_shape(name) is not None]:  # mounted whole too
            assert kc.base_moe_shape(name) in known, f"{gpu}/{name} is not a known model's base MoE shape"
            bundle.pop(name)
        covered: dict[str, set] = {name: set() for name in bundle}
        for shape in {kc.model_shapes.key(s): s for s in kc.model_shapes.KNOWN_SHAPES.values()}.values():
            for name, text in kc.for_shape({**bundle, **dense}, shape, gpu=gpu).items():
                data = json.loads(text)
                if name in dense:
                    assert data == json.loads(dense[name]), f"{gpu}/{name} was cut"
                    continue
                covered[name] |= (
                    {json.dumps(e, sort_keys=True) for e in data["entries"]}
                    if name == f"{gpu}.json"
                    else set(vllm_leaves(data))
                )
        for name, text in bundle.items():
            data = json.loads(text)
            everything = (
                {json.dumps(e, sort_keys=True) for e in data["entries"]}
                if name == f"{gpu}.json"
                else set(vllm_leaves(data))
            )
            assert everything == covered[name], f"{gpu}/{name} has entries of a shape not in KNOWN_SHAPES"


def test_an_explicit_shape_serves_a_model_moelora_does_not_know(bundle: pathlib.Path) -> None:
    qwen = kc.volume(auto_spec(QWEN3), name="srv", namespace="ns", labels=LABELS, root=bundle)
    shape = {"hiddenSize": 2048, "moeIntermediateSize": 768, "numExperts": 128}
    spec = auto_spec("my-org/my-qwen3-finetune", kernels={"configs": "auto", "shape": shape})
    volume = kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert volume is not None and qwen is not None and volume.content_hash == qwen.content_hash
    files = mounted(volume)
    pop_dense(files, bundle / "NVIDIA_H200", QWEN3)
    assert_only_shape(files, QWEN3)
    # Given, the shape wins over the one moelora knows for the id.
    spec = auto_spec(GPT_OSS, kernels={"configs": "auto", "shape": shape})
    files = mounted(kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=bundle))
    pop_dense(files, bundle / "NVIDIA_H200", QWEN3)
    assert_only_shape(files, QWEN3)


def test_an_unknown_model_without_a_shape_is_a_problem(bundle: pathlib.Path) -> None:
    with pytest.raises(SpecProblem) as caught:
        kc.volume(auto_spec("my-org/mystery-moe"), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "ModelShapeUnknown"
    assert "my-org/mystery-moe" in caught.value.message and "kernels.shape" in caught.value.message


def test_a_shape_with_nothing_bundled_is_a_problem_naming_what_is(bundle: pathlib.Path) -> None:
    shape = {"hiddenSize": 4096, "moeIntermediateSize": 1536, "numExperts": 128}
    spec = auto_spec("Qwen/Qwen3-235B-A22B", kernels={"configs": "auto", "shape": shape})
    with pytest.raises(SpecProblem) as caught:
        kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=bundle)
    message = caught.value.message
    assert caught.value.reason == "KernelConfigsNotFound" and "NVIDIA_H200" in message
    assert "hiddenSize=4096 moeIntermediateSize=1536 numExperts=128" in message
    assert "hiddenSize=2880 moeIntermediateSize=2880 numExperts=32 (openai/gpt-oss-20b)" in message
    assert "hiddenSize=2048 moeIntermediateSize=768 numExperts=128 (Qwen/Qwen3-30B-A3B" in message
    assert message.count("hiddenSize=") == 3  # the dense-op files, fitting any shape, do not make one bundled
    # Same hidden size, another intermediate size: nothing of GPT-OSS' leaks in.
    spec = auto_spec("x/y", kernels={"configs": "auto", "shape": {**shape, "hiddenSize": 2880}})
    with pytest.raises(SpecProblem, match="numExperts=128"):
        kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=bundle)


def test_files_in_neither_format_are_not_mounted(bundle: pathlib.Path) -> None:
    (bundle / "NVIDIA_H200" / "E=32,N=5760,device_name=NVIDIA_H200.json").write_text(
        json.dumps({"1": {"BLOCK_SIZE_M": 16}})
    )
    volume = kc.volume(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert volume is not None and {item["path"] for item in volume.items or []} == {
        "NVIDIA_H200.json",
        *VLLM_FILES[:2],
        *DENSE_FILES,
    }


def test_base_moe_files_are_mounted_whole_for_the_shapes_experts_and_intermediate_size(bundle: pathlib.Path) -> None:
    tree = {"1": {"BLOCK_SIZE_M": 16}, "1024": {"BLOCK_SIZE_M": 128}}
    names = {
        "gpt": "E=32,N=2880,device_name=NVIDIA_H200.json",
        "gpt_fp8": "E=32,N=2880,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
        "qwen": "E=128,N=768,device_name=NVIDIA_H200.json",
        "other": "E=64,N=2880,device_name=NVIDIA_H200.json",  # GPT-OSS' N, another expert count
    }
    for name in names.values():
        (bundle / "NVIDIA_H200" / name).write_text(json.dumps(tree))
    gpt = kc.volume(auto_spec(GPT_OSS), name="srv", namespace="ns", labels=LABELS, root=bundle)
    qwen = kc.volume(auto_spec(QWEN3), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert gpt is not None and qwen is not None
    gpt_files, qwen_files = mounted(gpt), mounted(qwen)
    assert {n for n in gpt_files if kc.base_moe_shape(n)} == {names["gpt"], names["gpt_fp8"]}
    assert {n for n in qwen_files if kc.base_moe_shape(n)} == {names["qwen"]}
    assert gpt_files[names["gpt"]] == tree  # whole, as bundled
    # vLLM's names hold '=' and ',': the ConfigMap key is made safe, the mounted path is the name vLLM looks up
    item = next(i for i in gpt.items or [] if i["path"] == names["gpt"])
    assert item["key"] == "E_32_N_2880_device_name_NVIDIA_H200.json"
    k8s_valid(gpt.owned_config_map)
    # Alone, a base file makes a shape bundled: it was tuned for exactly that shape.
    for file in (bundle / "NVIDIA_H200").iterdir():
        if kc.base_moe_shape(file.name) is None:
            file.unlink()
    (bundle / "NVIDIA_H200.json").unlink()
    only = kc.volume(auto_spec(QWEN3), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert only is not None and [i["path"] for i in only.items or []] == [names["qwen"]]


def test_a_single_file_per_gpu_is_bundled_too(bundle: pathlib.Path) -> None:
    (bundle / "NVIDIA_B200.json").write_text(json.dumps({"entries": [table_entry(2880, 5760, 32)]}))
    spec = auto_spec(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"})
    volume = kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert volume is not None and volume.items == [{"key": "NVIDIA_B200.json", "path": "NVIDIA_B200.json"}]
    assert set(kc.read_bundle("NVIDIA_H200", root=bundle)) == {"NVIDIA_H200.json", *VLLM_FILES, *DENSE_FILES}


def test_the_hash_follows_the_models_content_only(bundle: pathlib.Path) -> None:
    def hashes() -> tuple[str, str]:
        plans = [
            kc.volume(auto_spec(model), name="srv", namespace="ns", labels=LABELS, root=bundle)
            for model in (GPT_OSS, QWEN3)
        ]
        assert plans[0] and plans[1]
        return plans[0].content_hash, plans[1].content_hash

    gpt, qwen = hashes()
    assert gpt != qwen  # one GPU, two models: two contents
    w2_expand = bundle / "NVIDIA_H200" / VLLM_FILES[2]
    tree = json.loads(w2_expand.read_text())
    tree["1"]["1"]["1"]["16"]["2048"]["768"]["block_m"] = 64
    w2_expand.write_text(json.dumps(tree))
    gpt_after, qwen_after = hashes()
    assert gpt_after == gpt and qwen_after != qwen  # a Qwen3-only change rolls only Qwen3's pods


def test_colliding_keys_stay_unique() -> None:
    taken: set[str] = set()
    assert [kc.config_map_key(n, taken) for n in ("a=b.json", "a,b.json", "a_b.json")] == [
        "a_b.json",
        "2-a_b.json",
        "3-a_b.json",
    ]


def test_auto_without_a_gpu_label_is_a_problem(bundle: pathlib.Path) -> None:
    with pytest.raises(SpecProblem) as caught:
        kc.volume(auto_spec(nodeSelector={}), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "GPUUnknown"


def test_auto_without_a_bundled_set_is_a_problem_not_a_fallback(bundle: pathlib.Path) -> None:
    spec = auto_spec(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"})
    with pytest.raises(SpecProblem) as caught:
        kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "KernelConfigsNotFound" and "NVIDIA_B200" in caught.value.message
    with pytest.raises(SpecProblem):
        kc.volume(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=None)


def test_auto_over_a_config_maps_limit_is_a_problem(bundle: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kc, "MAX_CONFIG_BYTES", 64 * 1024)  # the rule, not the size: a 1 MiB table costs 0.4 s here
    table_path = bundle / "NVIDIA_H200.json"
    table = json.loads(table_path.read_text())
    # Qwen3 entries for so many token counts that its cut outgrows a ConfigMap; GPT-OSS' stays small.
    entry = table_entry(768, 2048, 128)
    table["entries"] += [
        entry | {"m": m} for m in range(2, 2 + kc.MAX_CONFIG_BYTES // len(json.dumps(entry, indent=1)))
    ]
    table_path.write_text(json.dumps(table))
    assert kc.volume(auto_spec(GPT_OSS), name="srv", namespace="ns", labels=LABELS, root=bundle)  # cut away
    with pytest.raises(SpecProblem) as caught:
        kc.volume(auto_spec(QWEN3), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "KernelConfigsTooLarge"


def test_config_map_mode_mounts_the_users_and_hashes_its_data(bundle: pathlib.Path) -> None:
    spec = make_spec(kernels={"configs": "configMap", "configMapName": "tuned"})
    volume = kc.volume(
        spec,
        name="srv",
        namespace="ns",
        labels=LABELS,
        root=bundle,
        user_config_map={"data": {"NVIDIA_H200_SHRINK.json": "{}"}},
    )
    assert volume is not None
    assert (volume.config_map_name, volume.items, volume.owned_config_map) == ("tuned", None, None)
    other = kc.volume(
        spec,
        name="srv",
        namespace="ns",
        labels=LABELS,
        root=bundle,
        user_config_map={"data": {"NVIDIA_H200_SHRINK.json": '{"1": {}}'}},
    )
    assert other is not None and other.content_hash != volume.content_hash
    with pytest.raises(SpecProblem) as caught:
        kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=bundle, user_config_map=None)
    assert caught.value.reason == "ConfigMapNotFound"


def test_the_bundled_table_is_cut_through_its_schema() -> None:
    """The real bundle: each model's cut is the bundled table's own entries, device and source, written as the
    tuner writes (the schema's dump), and together the cuts hold every entry."""
    root = kc.bundle_root()
    assert root is not None
    text = kc.read_bundle("NVIDIA_H200", root=root)["NVIDIA_H200.json"]
    bundled = KernelTable.parse(text, origin="bundled")
    seen: set[object] = set()
    for model in (GPT_OSS, QWEN3):
        out = kc.for_shape({"NVIDIA_H200.json": text}, shape_of(model), gpu="NVIDIA_H200")["NVIDIA_H200.json"]
        cut = KernelTable.parse(out, origin=model)
        assert cut.entries and set(cut.entries) <= set(bundled.entries)
        assert out == bundled.model_copy(update={"entries": cut.entries}).dump()
        assert (cut.device, cut.source) == (bundled.device, bundled.source)
        seen |= set(cut.entries)
    assert seen == set(bundled.entries)


def test_a_malformed_bundled_table_is_a_problem_naming_the_field(bundle: pathlib.Path) -> None:
    table = json.loads((bundle / "NVIDIA_H200.json").read_text())
    table["entries"][0]["config"]["split_k"] = "4"
    (bundle / "NVIDIA_H200.json").write_text(json.dumps(table))
    with pytest.raises(SpecProblem) as caught:
        kc.volume(auto_spec(QWEN3), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "KernelConfigsInvalid"
    assert caught.value.message.startswith("bundled NVIDIA_H200.json: not a moelora kernel table: ")
    assert "entries[0].config.split_k: Input should be a valid integer (got '4')" in caught.value.message


@pytest.mark.parametrize(
    ("node_selector", "key"),
    [(H200, "NVIDIA_H200.json"), ({}, "my-table.json")],
    ids=["the-gpus-table", "a-table-without-a-gpu-label"],
)
def test_config_map_mode_refuses_a_malformed_table_of_the_users(node_selector: dict, key: str) -> None:
    spec = make_spec(kernels={"configs": "configMap", "configMapName": "tuned"}, nodeSelector=node_selector)
    good = table_entry(2880, 5760, 32)
    bad = good | {"m": 4, "config": {"split_k": 2, "shrink_warps": 0}}
    vllm_file = {"NVIDIA_H200_SHRINK.json": '{"1": {}}'}  # vLLM's format: not ours to check
    for entries in ([good], [good, good]):  # well formed: mounted
        data = {key: json.dumps({"entries": entries}), **vllm_file}
        assert kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=None, user_config_map={"data": data})
    with pytest.raises(SpecProblem) as caught:
        data = {key: json.dumps({"entries": [good, bad]}), **vllm_file}
        kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=None, user_config_map={"data": data})
    assert caught.value.reason == "KernelConfigsInvalid"
    assert caught.value.message.startswith(f"ConfigMap tuned, key {key}: not a moelora kernel table: ")
    assert "entries[1].config.shrink_warps: Input should be greater than or equal to 1" in caught.value.message


def test_config_map_mode_refuses_the_gpus_table_without_entries() -> None:
    spec = make_spec(kernels={"configs": "configMap", "configMapName": "tuned"}, nodeSelector=H200)
    with pytest.raises(SpecProblem, match="key NVIDIA_H200.json: .*entries: Field required"):
        data = {"NVIDIA_H200.json": '{"device": "NVIDIA H200"}'}
        kc.volume(spec, name="srv", namespace="ns", labels=LABELS, root=None, user_config_map={"data": data})


def test_the_bundle_is_found_without_importing_torch() -> None:
    code = (
        "import sys; from moelora.operator.render import kernel_configs as kc; root = kc.bundle_root(); "
        "print(root is not None and str(root).endswith('moelora/kernels/configs'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["True", "False"]
