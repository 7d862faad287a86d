"""`kernels.configs: auto` through the real operator: an owned ConfigMap cut to the model's shape, conditions for
what has no bundled set, and the ConfigMap deleted (only if ours) once the server stops asking for it."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Iterator

import pytest

from moelora.local.apiserver import KubeAPI
from moelora.local.operator_thread import OperatorThread

from .cluster import DEPLOYMENTS, MS, apply, condition, manifest, wait_for
from .conftest import running_operator


@pytest.fixture(scope="module")
def kernel_bundle(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Stands in for moelora.kernels' bundled configs (filled by the tuner on real GPUs)."""
    root = tmp_path_factory.mktemp("kernel-configs")
    (root / "NVIDIA_H200").mkdir()
    # vLLM's data[max_loras][num_slices][m][rank][hidden][inter]: one GPT-OSS-20B leaf, one Qwen3-30B-A3B leaf.
    leaf = {
        "block_m": 16,
        "block_n": 32,
        "block_k": 32,
        "group_size_m": 8,
        "num_warps": 4,
        "num_stages": 3,
        "split_k": 1,
    }
    (root / "NVIDIA_H200" / "NVIDIA_H200_FUSED_MOE_LORA_W2_SHRINK.json").write_text(
        json.dumps({"1": {"1": {"1": {"16": {"2880": {"2880": leaf}, "2048": {"768": leaf}}}}}})
    )
    (root / "NVIDIA_H200.json").write_text(
        json.dumps(
            {
                "entries": [
                    {"k": 2880, "n": 5760, "rank": 16, "num_experts": 32, "max_loras": 1, "m": 1, "config": {}},
                    {"k": 768, "n": 2048, "rank": 16, "num_experts": 128, "max_loras": 1, "m": 1, "config": {}},
                ]
            }
        )
    )
    return root


@pytest.fixture(scope="module")
def operator(kube: KubeAPI, kernel_bundle: pathlib.Path) -> Iterator[OperatorThread]:
    with running_operator(kube, resync_seconds=1.0, kernel_configs_dir=str(kernel_bundle)) as running:
        yield running


def test_auto_kernel_configs_are_an_owned_config_map(kube: KubeAPI, operator: OperatorThread) -> None:
    ns = "kernels"
    apply(kube, manifest("modelserver-s3.yaml", namespace=ns, s3={}))  # no Secret needed for this test
    server = wait_for(lambda: kube.get(MS, ns, "gpt-oss"), what="the server")
    config_map = wait_for(lambda: kube.get("v1/configmaps", ns, "gpt-oss-kernel-configs"), what="the ConfigMap")
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == server["metadata"]["uid"]
    assert set(config_map["data"]) == {"NVIDIA_H200_FUSED_MOE_LORA_W2_SHRINK.json", "NVIDIA_H200.json"}
    # Only the model's shape: GPT-OSS-20B's leaf and table entry, not Qwen3's.
    assert (
        "2048" not in json.loads(config_map["data"]["NVIDIA_H200_FUSED_MOE_LORA_W2_SHRINK.json"])["1"]["1"]["1"]["16"]
    )
    assert [e["num_experts"] for e in json.loads(config_map["data"]["NVIDIA_H200.json"])["entries"]] == [32]
    dep = wait_for(lambda: kube.get(DEPLOYMENTS, ns, "gpt-oss"), what="the Deployment")
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "kernel-configs")
    assert {"key": "NVIDIA_H200.json", "path": "NVIDIA_H200.json"} in volume["configMap"]["items"]
    assert dep["spec"]["template"]["metadata"]["annotations"]["moelora.io/kernel-configs-hash"]
    [fetch] = dep["spec"]["template"]["spec"]["initContainers"]  # s3:// weights
    assert fetch["args"][:2] == ["fetch-model", "s3://models/openai/gpt-oss-20b/"]

    # A GPU with no bundled set is a condition, not a silent fallback; the running server is left alone.
    apply(
        kube,
        manifest("modelserver-s3.yaml", namespace=ns, s3={}, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"}),
    )
    reason = wait_for(
        lambda: (c := condition(kube.get(MS, ns, "gpt-oss"), "Degraded")) and c["status"] == "True" and c["reason"],
        what="KernelConfigsNotFound",
    )
    assert reason == "KernelConfigsNotFound"
    assert kube.get(DEPLOYMENTS, ns, "gpt-oss")["spec"] == dep["spec"]

    # A model whose shape moelora does not know, and no kernels.shape: a condition too.
    apply(kube, manifest("modelserver-s3.yaml", namespace=ns, s3={}, model={"name": "my-org/mystery-moe"}))
    wait_for(
        lambda: (
            (c := condition(kube.get(MS, ns, "gpt-oss"), "Degraded"))
            and c["status"] == "True"
            and c["reason"] == "ModelShapeUnknown"
        ),
        what="ModelShapeUnknown",
    )
    assert kube.get(DEPLOYMENTS, ns, "gpt-oss")["spec"] == dep["spec"]

    # Back to none: the volume, the annotation, the init container's absence all follow.
    apply(
        kube,
        manifest(
            "modelserver-s3.yaml",
            namespace=ns,
            s3={},
            kernels={"configs": "none"},
            model={"name": "openai/gpt-oss-20b"},
        ),
    )
    plain = wait_for(
        lambda: (
            (d := kube.get(DEPLOYMENTS, ns, "gpt-oss")) and "initContainers" not in d["spec"]["template"]["spec"] and d
        ),
        what="the updated Deployment",
    )
    assert all(v["name"] != "kernel-configs" for v in plain["spec"]["template"]["spec"]["volumes"])
    assert "moelora.io/kernel-configs-hash" not in (plain["spec"]["template"]["metadata"].get("annotations") or {})
    wait_for(lambda: condition(kube.get(MS, ns, "gpt-oss"), "Degraded")["status"] == "False", what="recovered")
    wait_for(lambda: kube.get("v1/configmaps", ns, "gpt-oss-kernel-configs") is None, what="the stale ConfigMap gone")
    # A ConfigMap of that name that the server does not own is never touched.
    kube.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "gpt-oss-kernel-configs", "namespace": ns},
                "data": {"mine": "yes"},
            }
        ),
    )
    time.sleep(1.5)  # a resync or two
    assert kube.get("v1/configmaps", ns, "gpt-oss-kernel-configs")["data"] == {"mine": "yes"}


def test_a_foreign_config_map_of_the_name_is_never_mounted(kube: KubeAPI, operator: OperatorThread) -> None:
    # The pods would mount someone else's kernel configs: the Deployment waits, and what serves it with it.
    ns = "kernels-taken"
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpt-oss-kernel-configs", "namespace": ns},
        "data": {"NVIDIA_H200.json": "{}"},
    }
    apply(kube, foreign)
    before = kube.get("v1/configmaps", ns, "gpt-oss-kernel-configs")
    apply(kube, manifest("modelserver-s3.yaml", namespace=ns, s3={}))
    degraded = wait_for(
        lambda: (c := condition(kube.get(MS, ns, "gpt-oss"), "Degraded")) and c["reason"] == "NameTaken" and c,
        what="NameTaken",
    )
    assert degraded["message"] == "ConfigMap gpt-oss-kernel-configs exists and is not owned by ModelServer gpt-oss"
    time.sleep(1.5)  # a resync later, still nothing rendered over it
    assert kube.get("v1/configmaps", ns, "gpt-oss-kernel-configs") == before
    assert kube.get(DEPLOYMENTS, ns, "gpt-oss") is None and kube.get("v1/services", ns, "gpt-oss") is None
