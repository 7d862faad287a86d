from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from moelora.operator import kernelconfigs as kc
from moelora.operator.engine import SpecProblem

from .conftest import k8s_valid, make_spec

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
LABELS = {"app.kubernetes.io/managed-by": "moelora"}


@pytest.fixture
def bundle(tmp_path: pathlib.Path) -> pathlib.Path:
    """A stand-in for moelora.kernels' bundled configs/ (the tuner fills the real one)."""
    gpu = tmp_path / "NVIDIA_H200"
    gpu.mkdir()
    (gpu / "E=8,N=64,device_name=NVIDIA_H200.json").write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}}))
    (gpu / "NVIDIA_H200_SHRINK.json").write_text(json.dumps({"1": {"block_m": 32}}))
    (gpu / "README.txt").write_text("not a config")
    return tmp_path


def auto_spec(**overrides: object) -> object:
    return make_spec(kernels={"configs": "auto"}, nodeSelector=H200, **overrides)


@pytest.mark.parametrize(("product", "device"), [
    ("NVIDIA-H200", "NVIDIA_H200"), ("NVIDIA-H100-80GB-HBM3", "NVIDIA_H100_80GB_HBM3"), ("NVIDIA A100", "NVIDIA_A100")])
def test_device_name_is_vllms_form(product: str, device: str) -> None:
    assert kc.device_name({"nvidia.com/gpu.product": product}) == device
    assert kc.device_name({}) is None


def test_none_mode_has_no_volume(bundle: pathlib.Path) -> None:
    assert kc.plan(make_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle) is None


def test_auto_renders_an_owned_config_map_with_safe_keys(bundle: pathlib.Path) -> None:
    plan = kc.plan(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert plan is not None and plan.owned_config_map is not None
    k8s_valid(plan.owned_config_map)
    assert plan.config_map_name == "srv-kernel-configs"
    assert plan.owned_config_map["metadata"]["labels"] == LABELS
    # ConfigMap keys may not hold '=' or ','; the volume's items map them back to vLLM's file names.
    paths = {item["key"]: item["path"] for item in plan.items or []}
    assert paths == {"E_8_N_64_device_name_NVIDIA_H200.json": "E=8,N=64,device_name=NVIDIA_H200.json",
                     "NVIDIA_H200_SHRINK.json": "NVIDIA_H200_SHRINK.json"}
    assert set(plan.owned_config_map["data"]) == set(paths)
    assert json.loads(plan.owned_config_map["data"]["NVIDIA_H200_SHRINK.json"]) == {"1": {"block_m": 32}}


def test_a_single_file_per_gpu_is_bundled_too(bundle: pathlib.Path) -> None:
    (bundle / "NVIDIA_B200.json").write_text(json.dumps({"entries": []}))
    spec = make_spec(kernels={"configs": "auto"}, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"})
    plan = kc.plan(spec, name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert plan is not None and plan.items == [{"key": "NVIDIA_B200.json", "path": "NVIDIA_B200.json"}]
    assert set(kc.read_bundle("NVIDIA_H200", root=bundle)) == {"E=8,N=64,device_name=NVIDIA_H200.json",
                                                               "NVIDIA_H200_SHRINK.json"}


def test_new_content_changes_the_hash(bundle: pathlib.Path) -> None:
    before = kc.plan(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle)
    (bundle / "NVIDIA_H200" / "NVIDIA_H200_SHRINK.json").write_text(json.dumps({"1": {"block_m": 64}}))
    after = kc.plan(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert before and after and before.content_hash != after.content_hash


def test_colliding_keys_stay_unique() -> None:
    taken: set[str] = set()
    assert [kc.config_map_key(n, taken) for n in ("a=b.json", "a,b.json", "a_b.json")] == \
        ["a_b.json", "2-a_b.json", "3-a_b.json"]


def test_auto_without_a_gpu_label_is_a_problem(bundle: pathlib.Path) -> None:
    with pytest.raises(SpecProblem) as caught:
        kc.plan(make_spec(kernels={"configs": "auto"}), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "GPUUnknown"


def test_auto_without_a_bundled_set_is_a_problem_not_a_fallback(bundle: pathlib.Path) -> None:
    spec = make_spec(kernels={"configs": "auto"}, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"})
    with pytest.raises(SpecProblem) as caught:
        kc.plan(spec, name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "KernelConfigsNotFound" and "NVIDIA_B200" in caught.value.message
    with pytest.raises(SpecProblem):
        kc.plan(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=None)


def test_auto_over_a_config_maps_limit_is_a_problem(bundle: pathlib.Path) -> None:
    (bundle / "NVIDIA_H200" / "big.json").write_text(json.dumps({"pad": "x" * kc.MAX_CONFIG_BYTES}))
    with pytest.raises(SpecProblem) as caught:
        kc.plan(auto_spec(), name="srv", namespace="ns", labels=LABELS, root=bundle)
    assert caught.value.reason == "KernelConfigsTooLarge"


def test_config_map_mode_mounts_the_users_and_hashes_its_data(bundle: pathlib.Path) -> None:
    spec = make_spec(kernels={"configs": "configMap", "configMapName": "tuned"})
    plan = kc.plan(spec, name="srv", namespace="ns", labels=LABELS, root=bundle,
                   user_config_map={"data": {"NVIDIA_H200_SHRINK.json": "{}"}})
    assert plan is not None
    assert (plan.config_map_name, plan.items, plan.owned_config_map) == ("tuned", None, None)
    other = kc.plan(spec, name="srv", namespace="ns", labels=LABELS, root=bundle,
                    user_config_map={"data": {"NVIDIA_H200_SHRINK.json": "{\"1\": {}}"}})
    assert other is not None and other.content_hash != plan.content_hash
    with pytest.raises(SpecProblem) as caught:
        kc.plan(spec, name="srv", namespace="ns", labels=LABELS, root=bundle, user_config_map=None)
    assert caught.value.reason == "ConfigMapNotFound"


def test_the_bundle_is_found_without_importing_torch() -> None:
    code = ("import sys; from moelora.operator import kernelconfigs as kc; root = kc.bundle_root(); "
            "print(root is not None and str(root).endswith('moelora/kernels/configs'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["True", "False"]
