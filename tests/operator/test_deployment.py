from __future__ import annotations

import dataclasses
from typing import Any

import kubernetes_validate
import pytest

from moelora.operator.errors import SpecProblem
from moelora.operator.render import deployment as dep
from moelora.operator.render import naming, service
from moelora.operator.render.kernel_configs import KernelConfigVolume
from moelora.operator.settings import MAX_DRAIN_DELAY_SECONDS, Settings

from .conftest import k8s_valid, make_spec

OLDEST_KUBERNETES = "1.31.0"  # charts/moelora/Chart.yaml's kubeVersion floor


def containers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_minimal_pod_as_the_architecture_doc_says(settings: Settings) -> None:
    obj = dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    assert obj["spec"]["selector"]["matchLabels"] == {"moelora.io/model-server": "srv"}
    assert obj["spec"]["template"]["metadata"]["labels"] == {
        "app.kubernetes.io/name": "moelora-server",
        "app.kubernetes.io/instance": "srv",
        "app.kubernetes.io/managed-by": "moelora",
        "moelora.io/model-server": "srv",
    }
    pod = obj["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "moelora-server"
    vllm, agent = containers(obj)["vllm"], containers(obj)["agent"]
    assert vllm["image"] == "example.com/server:1" and agent["image"] == "example.com/agent:1"
    assert vllm["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert agent["command"] == ["python3", "-m", "moelora.agent"] and "args" not in agent
    assert vllm["resources"] == {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup_budget = vllm["startupProbe"]["periodSeconds"] * vllm["startupProbe"]["failureThreshold"]
    assert startup_budget >= 1800
    assert obj["spec"]["progressDeadlineSeconds"] > startup_budget  # loading is not "stalled" while probes allow it
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    mounts = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}
    assert mounts == {
        "adapters": "/var/lib/moelora/adapters",
        "dshm": "/dev/shm",
        "admin-key": "/var/run/moelora/admin",
        "tmp": "/tmp",
        "home": "/home/moelora",
    }
    assert {m["name"]: m["mountPath"] for m in agent["volumeMounts"]} == {
        "adapters": "/var/lib/moelora/adapters",
        "admin-key": "/var/run/moelora/admin",
        "kube-api-access": "/var/run/secrets/kubernetes.io/serviceaccount",
        "tmp": "/tmp",
        "home": "/var/run/moelora/vllm-home",  # read-only: the hub's copy of the base model's config.json
    }
    assert next(m for m in agent["volumeMounts"] if m["name"] == "home")["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["adapters"]["emptyDir"] == {"sizeLimit": "20Gi"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    env = env_of(agent)
    assert env["MOELORA_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["MOELORA_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["MOELORA_MODEL_SERVER"] == "srv" and env["MOELORA_BASE_MODEL"] == "org/tiny-moe"
    assert env["MOELORA_BASE_MODEL_CONFIG"] == (
        "/var/run/moelora/vllm-home/.cache/huggingface/hub/models--org--tiny-moe/snapshots/*/config.json"
    )
    assert env["MOELORA_MAX_LORA_RANK"] == "16"
    # Empty settings are left out (the API server would drop an empty value, a drift on every reconcile).
    assert not {"MOELORA_TARGET_MODULES", "MOELORA_ALLOWED_S3_ENDPOINTS", "MOELORA_ALLOWED_S3_BUCKETS"} & set(env)
    assert all(var.get("value") != "" for c in pod["containers"] for var in c.get("env") or [])
    assert env["MOELORA_VLLM_URL"] == "http://127.0.0.1:8000" and env["MOELORA_PORT"] == "8081"
    assert env["MOELORA_CACHE_DIR"] == "/var/lib/moelora/adapters"
    assert env["MOELORA_CACHE_BYTES"] == str(20 * 2**30)
    assert env["PYTHONMALLOC"] == "malloc" and env["MALLOC_ARENA_MAX"] == "2"  # a refused header's heap goes back
    assert not any(name.startswith("AWS_") for name in env)


def test_full_spec(settings: Settings) -> None:
    spec = make_spec(
        model={"name": "org/m", "source": "pvc://weights/llm/m"},
        image="my/vllm:2",
        replicas=3,
        gpus=2,
        gpuResourceName="amd.com/gpu",
        resources={"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}},
        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H200"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
                }
            }
        },
        lora={"targetModules": ["q_proj", "v_proj"]},
        adapterCache={"sizeLimit": "500M"},
        serviceAccountName="irsa",
        s3={"credentialsSecret": {"name": "creds"}, "endpointUrl": "http://minio:9000", "region": "eu-west-1"},
    )
    obj = dep.deployment(spec, name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    pod = obj["spec"]["template"]["spec"]
    assert obj["spec"]["replicas"] == 3
    assert pod["serviceAccountName"] == "irsa"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"][0]["key"] == "gpu"
    assert pod["affinity"]["nodeAffinity"]
    vllm, agent = containers(obj)["vllm"], containers(obj)["agent"]
    assert vllm["image"] == "my/vllm:2"
    assert vllm["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "amd.com/gpu": "2"},
        "limits": {"memory": "64Gi", "amd.com/gpu": "2"},
    }
    assert vllm["args"][vllm["args"].index("--model") + 1] == "/models/llm/m"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    env = env_of(agent)
    assert env["MOELORA_TARGET_MODULES"] == "q_proj,v_proj"
    assert env["MOELORA_CACHE_BYTES"] == "500000000"
    assert env["AWS_ENDPOINT_URL_S3"] == "http://minio:9000" and env["AWS_REGION"] == "eu-west-1"
    assert env["AWS_ACCESS_KEY_ID"] == {
        "secretKeyRef": {"name": "creds", "key": "AWS_ACCESS_KEY_ID", "optional": False}
    }
    assert env["AWS_SESSION_TOKEN"]["secretKeyRef"]["optional"] is True
    assert "AWS_ACCESS_KEY_ID" not in env_of(vllm)  # vLLM itself never sees the credentials


def test_s3_model_is_fetched_by_an_init_container(settings: Settings) -> None:
    spec = make_spec(
        model={"name": "org/m", "source": "s3://bucket/models/m"}, s3={"credentialsSecret": {"name": "creds"}}
    )
    obj = dep.deployment(spec, name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    pod = obj["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["command"] + init["args"] == [
        "python3",
        "-m",
        "moelora.agent",
        "fetch-model",
        "s3://bucket/models/m",
        "/models",
    ]
    assert env_of(init)["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "creds"
    assert {v["name"]: v for v in pod["volumes"]}["models"] == {"name": "models", "emptyDir": {}}
    vllm = containers(obj)["vllm"]
    assert vllm["args"][vllm["args"].index("--model") + 1] == "/models"
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in vllm["volumeMounts"]


def test_cpu_server_has_no_gpu_resources(settings: Settings) -> None:
    obj = dep.deployment(make_spec(gpus=0), name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    assert "resources" not in containers(obj)["vllm"]
    assert "--tensor-parallel-size" not in containers(obj)["vllm"]["args"]


def test_kernel_configs_are_mounted_and_hashed_into_the_template(settings: Settings) -> None:
    volume = KernelConfigVolume(
        config_map_name="srv-kernel-configs", content_hash="abc", items=[{"key": "E_8.json", "path": "E=8.json"}]
    )
    obj = dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings, kernel_configs=volume)
    k8s_valid(obj)
    volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
    assert volumes["kernel-configs"]["configMap"] == {
        "name": "srv-kernel-configs",
        "items": [{"key": "E_8.json", "path": "E=8.json"}],
    }
    vllm = containers(obj)["vllm"]
    assert {"name": "kernel-configs", "mountPath": "/etc/moelora/kernel-configs", "readOnly": True} in vllm[
        "volumeMounts"
    ]
    assert env_of(vllm)["VLLM_TUNED_CONFIG_FOLDER"] == "/etc/moelora/kernel-configs"
    assert obj["spec"]["template"]["metadata"]["annotations"] == {naming.ANNOTATION_KERNEL_CONFIGS: "abc"}
    other = KernelConfigVolume(config_map_name="srv-kernel-configs", content_hash="def", items=None)
    rolled = dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings, kernel_configs=other)
    assert rolled["spec"]["template"]["metadata"]["annotations"] != obj["spec"]["template"]["metadata"]["annotations"]


def test_the_moelora_kernel_runs_lora_on_a_second_stream(settings: Settings) -> None:
    spec = make_spec(kernels={"implementation": "moelora"})
    vllm = containers(dep.deployment(spec, name="srv", namespace="ns", settings=settings))["vllm"]
    assert env_of(vllm)["MOELORA_KERNEL"] == "moelora" and env_of(vllm)["VLLM_LORA_ENABLE_DUAL_STREAM"] == "1"
    # The directory the plugin reads adapters ahead from is the agent's cache, mounted in the vLLM container.
    ahead = env_of(vllm)["MOELORA_ADAPTERS_AHEAD_DIR"]
    assert any(m["mountPath"] == ahead and m["name"] == "adapters" for m in vllm["volumeMounts"])
    vllm = containers(dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings))["vllm"]
    assert "MOELORA_KERNEL" not in env_of(vllm) and "VLLM_LORA_ENABLE_DUAL_STREAM" not in env_of(vllm)
    spec = make_spec(
        kernels={"implementation": "moelora"}, env=[{"name": "VLLM_LORA_ENABLE_DUAL_STREAM", "value": "0"}]
    )
    with pytest.raises(SpecProblem) as caught:
        dep.deployment(spec, name="srv", namespace="ns", settings=settings)
    assert caught.value.reason == "ManagedEnvVar"


def _termination(obj: dict[str, Any]) -> tuple[int, dict[str, Any] | None, int]:
    """(the pod's grace period, the vLLM container's lifecycle, its --shutdown-timeout)."""
    vllm = containers(obj)["vllm"]
    args = vllm["args"]
    assert args.count("--shutdown-timeout") == 1  # vLLM's default, 0, aborts every running request on SIGTERM
    drain = int(args[args.index("--shutdown-timeout") + 1])
    return obj["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], vllm.get("lifecycle"), drain


def test_vllm_keeps_serving_for_the_drain_delay_then_drains_and_exits_before_the_sigkill(settings: Settings) -> None:
    assert settings.drain_delay_seconds == 5  # the default
    obj = dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    kubernetes_validate.validate(obj, OLDEST_KUBERNETES, strict=True)
    grace, lifecycle, drain = _termination(obj)
    assert lifecycle == {"preStop": {"sleep": {"seconds": 5}}}
    # The kubelet runs the hook, then sends SIGTERM: both and a few seconds of vLLM's own teardown fit the grace period.
    assert 60 <= drain <= grace - 5 - 5


def test_no_drain_delay_renders_no_hook_and_gives_vllm_its_time(settings: Settings) -> None:
    delayed = _termination(dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings))
    settings = dataclasses.replace(settings, drain_delay_seconds=0)
    obj = dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    grace, lifecycle, drain = _termination(obj)
    assert lifecycle is None
    assert drain == delayed[2] + 5 and drain < grace


def test_the_shutdown_timeout_shrinks_by_the_drain_delay(settings: Settings) -> None:
    def drain(delay: int) -> int:
        changed = dataclasses.replace(settings, drain_delay_seconds=delay)
        return _termination(dep.deployment(make_spec(), name="srv", namespace="ns", settings=changed))[2]

    assert drain(0) - drain(30) == 30
    assert drain(0) - drain(MAX_DRAIN_DELAY_SECONDS) == MAX_DRAIN_DELAY_SECONDS and drain(MAX_DRAIN_DELAY_SECONDS) > 0


def test_refused_engine_args_raise(settings: Settings) -> None:
    with pytest.raises(SpecProblem):
        dep.deployment(make_spec(engineArgs=["--bogus"]), name="srv", namespace="ns", settings=settings)


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("20Gi", 20 * 2**30), ("500M", 500 * 10**6), ("1.5Ki", 1536), ("1e3", 1000), ("7", 7), ("1500m", 1)],
)
def test_quantity_bytes(quantity: str, expected: int) -> None:
    assert dep.quantity_bytes(quantity) == expected


def test_service() -> None:
    obj = service.service(name="srv", namespace="ns")
    k8s_valid(obj)
    assert obj["spec"]["selector"] == {"moelora.io/model-server": "srv"}
    assert obj["spec"]["ports"][0] == {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    assert naming.endpoint("srv", "ns") == "http://srv.ns.svc:8000/v1"


# --- the pod's security contract (issue 16) ---------------------------------------------------------------------


def test_admin_routes_are_guarded_by_a_key_only_the_two_containers_share(settings: Settings) -> None:
    obj = dep.deployment(make_spec(), name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    vllm, agent = containers(obj)["vllm"], containers(obj)["agent"]
    args = vllm["args"]
    assert args[args.index("--middleware") + 1] == "moelora.vllm_plugin.admin_guard.AdminGuard"
    assert env_of(vllm)["MOELORA_ADMIN_KEY_FILE"] == env_of(agent)["MOELORA_ADMIN_KEY_FILE"]
    assert env_of(agent)["MOELORA_ADMIN_KEY_FILE"] == "/var/run/moelora/admin/key"
    volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
    assert volumes["admin-key"]["emptyDir"]["medium"] == "Memory"
    vllm_mount = next(m for m in vllm["volumeMounts"] if m["name"] == "admin-key")
    agent_mount = next(m for m in agent["volumeMounts"] if m["name"] == "admin-key")
    assert vllm_mount["readOnly"] is True and not agent_mount.get("readOnly")  # only the agent writes the key
    assert "VLLM_API_KEY" not in env_of(vllm) and "MOELORA_VLLM_API_KEY" not in env_of(agent)


def test_the_guard_is_the_plugins_class() -> None:
    from moelora.operator.render import engine
    from moelora.vllm_plugin import admin_guard

    module, _, name = engine.ADMIN_GUARD.rpartition(".")
    assert module == admin_guard.__name__ and getattr(admin_guard, name) is admin_guard.AdminGuard
    assert engine.ADMIN_KEY_FILE == admin_guard.DEFAULT_KEY_FILE
    assert engine.ADMIN_KEY_FILE_ENV == admin_guard.KEY_FILE_ENV


def test_client_api_key_reaches_vllm_and_the_agent_from_the_secret(settings: Settings) -> None:
    spec = make_spec(apiKeySecret={"name": "client-key", "key": "token"}, s3={"credentialsSecret": {"name": "creds"}})
    obj = dep.deployment(spec, name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    vllm, agent = containers(obj)["vllm"], containers(obj)["agent"]
    ref = {"secretKeyRef": {"name": "client-key", "key": "token"}}
    assert env_of(vllm)["VLLM_API_KEY"] == ref
    assert env_of(agent)["MOELORA_VLLM_API_KEY"] == ref
    assert "--api-key" not in vllm["args"]
    assert engine_required_secrets(spec) == [
        ("creds", "S3 credentials"),
        ("client-key", "client API key (spec.apiKeySecret)"),
    ]
    assert make_spec(apiKeySecret={"name": "k"}).api_key_secret.key == "api-key"  # type: ignore[union-attr]


def engine_required_secrets(spec: Any) -> list[tuple[str, str]]:
    from moelora.operator.render import engine

    return engine.required_secrets(spec)


@pytest.mark.parametrize(
    ("overrides", "reason", "hint"),
    [
        ({"engineArgs": ["--api-key", "s3cret"]}, "ManagedEngineFlag", "spec.apiKeySecret"),
        ({"engineArgs": ["--api-key=s3cret"]}, "ManagedEngineFlag", "spec.apiKeySecret"),
        ({"env": [{"name": "VLLM_API_KEY", "value": "s3cret"}]}, "ManagedEnvVar", "spec.apiKeySecret"),
        ({"env": [{"name": "MOELORA_ADMIN_KEY_FILE", "value": "/tmp/k"}]}, "ManagedEnvVar", "moelora sets it"),
    ],
)
def test_api_keys_are_refused_outside_the_field(
    settings: Settings, overrides: dict[str, Any], reason: str, hint: str
) -> None:
    with pytest.raises(SpecProblem) as caught:
        dep.deployment(make_spec(**overrides), name="srv", namespace="ns", settings=settings)
    assert caught.value.reason == reason and hint in caught.value.message
    assert "s3cret" not in caught.value.message


def test_service_account_token_is_mounted_into_the_agent_only(settings: Settings) -> None:
    spec = make_spec(model={"name": "org/m", "source": "s3://bucket/m"})  # with the init container
    obj = dep.deployment(spec, name="srv", namespace="ns", settings=settings)
    k8s_valid(obj)
    pod = obj["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    projected = next(v for v in pod["volumes"] if v["name"] == "kube-api-access")["projected"]
    kinds = {next(iter(source)) for source in projected["sources"]}
    assert kinds == {"serviceAccountToken", "configMap", "downwardAPI"}
    config_map = next(s["configMap"] for s in projected["sources"] if "configMap" in s)
    assert config_map == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    holders = {
        c["name"]
        for c in [*pod["containers"], *pod["initContainers"]]
        for m in c.get("volumeMounts") or []
        if m["name"] == "kube-api-access" or m["mountPath"].startswith("/var/run/secrets")
    }
    assert holders == {"agent"}


@pytest.mark.parametrize(
    ("source", "config"),
    [("s3://bucket/models/tiny", "/models/config.json"), ("pvc://weights/tiny-moe", "/models/tiny-moe/config.json")],
)
def test_the_agent_reads_the_base_config_from_the_model_volume(source: str, config: str) -> None:
    obj = dep.deployment(
        make_spec(model={"name": "org/tiny-moe", "source": source}), name="srv", namespace="ns", settings=Settings()
    )
    agent = obj["spec"]["template"]["spec"]["containers"][1]
    assert {e["name"]: e.get("value") for e in agent["env"]}["MOELORA_BASE_MODEL_CONFIG"] == config
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in agent["volumeMounts"]


def test_a_compile_cache_claim_holds_each_images_compiled_kernels(settings: Settings) -> None:
    def render(**spec: Any) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
        """The vLLM container, its compile-cache mount and the pod's compile-cache volume (None: absent)."""
        obj = dep.deployment(make_spec(**spec), name="srv", namespace="ns", settings=settings)
        k8s_valid(obj)
        vllm = containers(obj)["vllm"]
        mount = next((m for m in vllm["volumeMounts"] if m["name"] == "compile-cache"), None)
        volume = next((v for v in obj["spec"]["template"]["spec"]["volumes"] if v["name"] == "compile-cache"), None)
        return vllm, mount, volume

    cached = {"kernels": {"compileCache": {"claimName": "compiled"}}}
    vllm, mount, volume = render(**cached)
    assert volume == {"name": "compile-cache", "persistentVolumeClaim": {"claimName": "compiled"}}  # read-write
    assert mount is not None and mount["mountPath"] == "/var/cache/moelora/compile" and not mount.get("readOnly")
    assert mount["subPath"].startswith("image-") and render(**cached)[1] == mount  # the same image, the same directory
    other = render(**cached, image="example.com/server:2")[1]
    assert other is not None and other["subPath"] != mount["subPath"]  # another image, another directory
    env = env_of(vllm)
    assert env["VLLM_CACHE_ROOT"] == "/var/cache/moelora/compile/vllm"
    assert env["TRITON_CACHE_DIR"] == "/var/cache/moelora/compile/triton"

    plain, mount, volume = render()
    assert mount is None and volume is None
    assert not {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"} & set(env_of(plain))


def test_the_compile_cache_variables_are_the_users_unless_compile_cache_is_set(settings: Settings) -> None:
    mine = [{"name": "TRITON_CACHE_DIR", "value": "/home/moelora/triton"}]
    obj = dep.deployment(make_spec(env=mine), name="srv", namespace="ns", settings=settings)
    assert env_of(containers(obj)["vllm"])["TRITON_CACHE_DIR"] == "/home/moelora/triton"
    with pytest.raises(SpecProblem) as problem:
        dep.deployment(
            make_spec(env=mine, kernels={"compileCache": {"claimName": "compiled"}}),
            name="srv",
            namespace="ns",
            settings=settings,
        )
    assert problem.value.reason == "ManagedEnvVar" and "compileCache" in problem.value.message
