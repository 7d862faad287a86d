"""A Deployment rendered by the operator becomes local processes with the documented translations only."""

from __future__ import annotations

import pathlib
import sys

import pytest

from moelora.api import ModelServerSpec
from moelora.local.kubelet import plan as kubelet_plan
from moelora.local.kubelet.controller import LocalKubelet
from moelora.operator.render.deployment import deployment
from moelora.operator.settings import Settings


def _rendered() -> dict:
    spec = ModelServerSpec.model_validate(
        {
            "model": {"name": "org/tiny", "source": "s3://models/tiny"},
            "gpus": 0,
            "engineArgs": ["--max-model-len=256"],
            "s3": {"endpointUrl": "http://127.0.0.1:9000", "credentialsSecret": {"name": "s3-creds"}},
        }
    )
    return deployment(spec, name="tiny", namespace="ns1", settings=Settings())


def _pod() -> dict:
    template = _rendered()["spec"]["template"]
    return {
        "metadata": {"name": "tiny-abc-1", "namespace": "ns1", "uid": "u1", **template["metadata"]},
        "spec": template["spec"],
    }


SECRETS = {("s3-creds", "AWS_ACCESS_KEY_ID"): "AKIDLOCAL", ("s3-creds", "AWS_SECRET_ACCESS_KEY"): "s3cr3t"}


def test_plan_translates_python_mounts_ports_downward_and_secrets(tmp_path: pathlib.Path) -> None:
    plan = kubelet_plan.plan_pod(
        pod=_pod(),
        root=tmp_path,
        ports={8000: 41000, 8081: 41001},
        secret=lambda name, key: SECRETS.get((name, key)),
        base_env={"PATH": "/bin"},
        extra_env={"agent": {"KUBECONFIG": "/k"}},
    )
    vllm, agent = plan.containers
    assert vllm.argv[:3] == (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
    args = list(vllm.argv)
    assert args[args.index("--port") + 1] == "41000"
    assert args[args.index("--model") + 1] == str(tmp_path / "volumes" / "models")
    assert "--max-model-len=256" in args  # untouched: not a port of the pod
    assert vllm.readiness == kubelet_plan.Probe(url="http://127.0.0.1:41000/health", failure_threshold=3)
    assert vllm.startup is not None and vllm.startup.url == "http://127.0.0.1:41000/health"
    assert agent.env["MOELORA_VLLM_URL"] == "http://127.0.0.1:41000"
    assert agent.env["MOELORA_PORT"] == "41001"
    assert agent.env["MOELORA_CACHE_DIR"] == str(tmp_path / "volumes" / "adapters")
    assert agent.env["MOELORA_NAMESPACE"] == "ns1" and agent.env["MOELORA_POD_NAME"] == "tiny-abc-1"
    assert agent.env["AWS_ACCESS_KEY_ID"] == "AKIDLOCAL" and agent.env["AWS_SECRET_ACCESS_KEY"] == "s3cr3t"
    assert "AWS_SESSION_TOKEN" not in agent.env  # optional and absent
    assert agent.env["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9000"  # not a pod port: unchanged
    assert agent.env["KUBECONFIG"] == "/k" and agent.env["PATH"] == "/bin"
    assert "KUBECONFIG" not in vllm.env
    assert agent.readiness is not None and agent.readiness.url == "http://127.0.0.1:41001/readyz"
    (fetch,) = plan.init_containers
    assert fetch.argv[-2:] == ("s3://models/tiny", str(tmp_path / "volumes" / "models"))
    assert plan.volumes["adapters"] == tmp_path / "volumes" / "adapters"


def test_the_plan_keeps_a_prestop_sleep_and_refuses_other_hooks(tmp_path: pathlib.Path) -> None:
    def plan(pod: dict) -> kubelet_plan.PodPlan:
        return kubelet_plan.plan_pod(
            pod=pod, root=tmp_path, ports={8000: 41000, 8081: 41001}, secret=lambda name, key: SECRETS.get((name, key))
        )

    rendered = _pod()
    vllm, agent = plan(rendered).containers
    assert vllm.pre_stop_sleep == Settings().drain_delay_seconds > 0 and agent.pre_stop_sleep == 0
    rendered["spec"]["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    with pytest.raises(ValueError, match="preStop"):
        plan(rendered)


def test_the_plan_keeps_the_pods_grace_period_or_kubernetes_default(tmp_path: pathlib.Path) -> None:
    def grace(pod: dict) -> float:
        return kubelet_plan.plan_pod(
            pod=pod, root=tmp_path, ports={8000: 41000, 8081: 41001}, secret=lambda name, key: SECRETS.get((name, key))
        ).grace

    rendered = _pod()
    assert grace(rendered) == rendered["spec"]["terminationGracePeriodSeconds"]
    del rendered["spec"]["terminationGracePeriodSeconds"]
    assert grace(rendered) == 30


def test_missing_required_secret_key_is_an_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="AWS_ACCESS_KEY_ID"):
        kubelet_plan.plan_pod(pod=_pod(), root=tmp_path, ports={8000: 1, 8081: 2}, secret=lambda name, key: None)


def test_rewriter_only_touches_whole_paths_and_ports(tmp_path: pathlib.Path) -> None:
    rewrite = kubelet_plan._rewriter(mounts={"/models": tmp_path / "m"}, ports={8000: 5})
    assert rewrite("/models") == str(tmp_path / "m")
    assert rewrite("/models/a/b") == f"{tmp_path}/m/a/b"
    assert rewrite("--x=/models/a") == f"--x={tmp_path}/m/a"
    assert rewrite("/models-other") == "/models-other"
    assert rewrite("/data/models") == "/data/models"
    assert rewrite("8000") == "5" and rewrite("--port=8000") == "--port=5"
    assert rewrite("http://h:8000/v1") == "http://h:5/v1"
    assert rewrite("http://h:80001") == "http://h:80001" and rewrite("18000") == "18000"


def test_pvc_volume_needs_a_local_claim(tmp_path: pathlib.Path) -> None:
    pod = _pod()
    pod["spec"]["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": "weights"}})
    with pytest.raises(ValueError, match="weights"):
        kubelet_plan.plan_pod(pod=pod, root=tmp_path, ports={8000: 1, 8081: 2}, secret=lambda n, k: "x")
    plan = kubelet_plan.plan_pod(
        pod=pod, root=tmp_path, ports={8000: 1, 8081: 2}, secret=lambda n, k: "x", claims={"weights": tmp_path / "w"}
    )
    assert plan.volumes["data"] == tmp_path / "w"


def test_a_volume_at_tmp_does_not_rewrite_a_local_directory_twice() -> None:
    # The rendered pod mounts an emptyDir at /tmp, and local pod roots live under /tmp themselves.
    root = pathlib.Path("/tmp/stack/pods/p1/volumes")
    rewrite = kubelet_plan._rewriter(mounts={"/tmp": root / "tmp", "/models": root / "models"}, ports={})
    assert rewrite("/models/m") == f"{root}/models/m"
    assert rewrite("/tmp/x") == f"{root}/tmp/x"


@pytest.mark.parametrize("checkout", ["/tmp/clone", "/home/moelora/src/clone", "/models/clone"])
def test_paths_of_this_machine_are_never_rewritten(
    checkout: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkout (and its .venv) under a folder the pod mounts over: /tmp, $HOME and /models are all mounted.
    interpreter = f"{checkout}/.venv/bin/python"
    monkeypatch.setattr(sys, "executable", interpreter)
    source = f"{checkout}/operator:{checkout}/local"
    plan = kubelet_plan.plan_pod(
        pod=_pod(),
        root=tmp_path,
        ports={8000: 41000, 8081: 41001},
        secret=lambda name, key: SECRETS.get((name, key)),
        base_env={"PYTHONPATH": source, "TMPDIR": "/tmp"},
        extra_env={"agent": {"KUBECONFIG": f"{checkout}/kubeconfig"}},
    )
    for container in (*plan.init_containers, *plan.containers):
        assert container.argv[0] == interpreter, container.name
        assert container.env["PYTHONPATH"] == source and container.env["TMPDIR"] == "/tmp"
    assert plan.containers[1].env["KUBECONFIG"] == f"{checkout}/kubeconfig"
    vllm_args = list(plan.containers[0].argv)
    assert vllm_args[vllm_args.index("--model") + 1] == str(tmp_path / "volumes" / "models")  # the pod's own path


def test_pods_share_the_nodes_vllm_cache_unless_their_own_sets_one(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "host-cache"))
    base_env = LocalKubelet(api_url="http://127.0.0.1:1", namespace="ns1", root=tmp_path / "pods").base_env
    shared = str(tmp_path / "host-cache" / "moelora" / "local-node" / "vllm")

    def vllm_env(pod: dict, root: pathlib.Path) -> dict[str, str]:
        plan = kubelet_plan.plan_pod(
            pod=pod, root=root, ports={8000: 1, 8081: 2}, secret=lambda n, k: SECRETS.get((n, k)), base_env=base_env
        )
        return dict(plan.containers[0].env)

    assert vllm_env(_pod(), tmp_path / "a")["VLLM_CACHE_ROOT"] == shared
    assert vllm_env(_pod(), tmp_path / "b")["VLLM_CACHE_ROOT"] == shared
    own = _pod()
    own["spec"]["containers"][0]["env"].append({"name": "VLLM_CACHE_ROOT", "value": "/var/cache/elsewhere"})
    assert vllm_env(own, tmp_path / "c")["VLLM_CACHE_ROOT"] != shared  # the pod's compileCache wins
