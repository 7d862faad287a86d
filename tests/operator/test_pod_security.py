"""Rendered server pods pass the restricted Pod Security Standard; overrides merge, and break nothing unseen."""

from __future__ import annotations

import copy
import pathlib
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from moelora.operator.errors import SpecProblem
from moelora.operator.render import deployment as dep
from moelora.operator.render import security
from moelora.operator.render.kernel_configs import KernelConfigVolume
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec
from .pss import RULES, violations

ROOT = pathlib.Path(__file__).parents[2]
PLAN = KernelConfigVolume(config_map_name="srv-kernel-configs", content_hash="abc", items=None)

SPECS = {
    "minimal": {},
    "s3-model-with-init-container": {
        "model": {"name": "org/m", "source": "s3://bucket/m"},
        "s3": {"credentialsSecret": {"name": "creds"}},
    },
    "pvc-model": {"model": {"name": "org/m", "source": "pvc://weights/m"}},
    "compile-cache": {"kernels": {"implementation": "moelora", "compileCache": {"claimName": "compiled"}}},
    "cpu-moelora-kernel": {"gpus": 0, "kernels": {"implementation": "moelora"}},
    "every-knob-and-allowed-overrides": {
        "model": {"name": "org/gated", "tokenSecret": {"name": "hf"}},
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "serving",
        "podLabels": {"team": "a"},
        "podAnnotations": {"example.com/owner": "a"},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "podSecurityContext": {
            "runAsUser": 3000,
            "supplementalGroups": [44],
            "seccompProfile": {"type": "Localhost", "localhostProfile": "vllm.json"},
        },
        "securityContext": {"readOnlyRootFilesystem": False, "capabilities": {"add": ["NET_BIND_SERVICE"]}},
        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "envFrom": [{"configMapRef": {"name": "tuning"}}],
    },
}


def template(settings: Settings, *, kernel_configs: KernelConfigVolume | None = None, **spec: Any) -> dict[str, Any]:
    obj = dep.deployment(
        make_spec(**spec), name="srv", namespace="ns", settings=settings, kernel_configs=kernel_configs
    )
    k8s_valid(obj)
    return obj["spec"]["template"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_rendered_pods_pass_the_restricted_profile(settings: Settings, name: str) -> None:
    pod = template(settings, kernel_configs=PLAN, **SPECS[name])
    assert violations(pod) == set()
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, container["name"]
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], container["name"]


def _example_servers() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.relative_to(ROOT / 'examples')}", obj)
        for path in sorted((ROOT / "examples").rglob("*.yaml"))
        for obj in yaml.safe_load_all(path.read_text())
        if obj and obj.get("kind") == "ModelServer"
    ]


@pytest.mark.parametrize(("path", "server"), _example_servers(), ids=[path for path, _ in _example_servers()])
def test_every_example_renders_a_restricted_pod(settings: Settings, path: str, server: dict[str, Any]) -> None:
    assert violations(template(settings, **server["spec"])) == set()


def test_the_default_user_is_the_server_images(settings: Settings) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    server_stage = dockerfile[dockerfile.index(" AS server") :]
    assert re.search(r"^USER (\d+):(\d+)$", server_stage, re.M).groups() == (str(security.SERVER_UID),) * 2
    assert f"HOME={security.HOME_DIR}" in server_stage


def test_defaults_are_the_server_images_user_and_writable_volumes(settings: Settings) -> None:
    pod = template(settings, model={"name": "org/m", "source": "s3://bucket/m"})["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 2000,
        "runAsGroup": 2000,
        "fsGroup": 2000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}} and volumes["home"] == {"name": "home", "emptyDir": {}}
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert {"name": "home", "mountPath": "/home/moelora"} in vllm["volumeMounts"]
    assert {"name": "HOME", "value": "/home/moelora"} in vllm["env"]


# --- the checker can fail: one pod built to break each rule -----------------------------------------------------------


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def _set(where: Callable[[dict[str, Any]], dict[str, Any]], **values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda pod: where(pod).update(values)


def _pod_sc(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["securityContext"]


def _vllm_sc(pod: dict[str, Any]) -> dict[str, Any]:
    return _container(pod, "vllm")["securityContext"]


def _agent_sc(pod: dict[str, Any]) -> dict[str, Any]:
    return _container(pod, "agent")["securityContext"]


BAD_PODS: dict[str, tuple[Callable[[dict[str, Any]], None], set[str]]] = {
    "host namespaces": (_set(lambda pod: pod["spec"], hostPID=True), {"host namespaces"}),
    "privileged containers": (_set(_vllm_sc, privileged=True), {"privileged containers"}),
    "capabilities": (
        _set(_agent_sc, capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        {"capabilities", "capabilities (restricted)"},
    ),
    "hostpath volumes": (
        lambda pod: pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
        {"hostpath volumes", "volume types"},
    ),
    "host ports": (lambda pod: _container(pod, "vllm")["ports"][0].update(hostPort=8000), {"host ports"}),
    "apparmor": (_set(_pod_sc, appArmorProfile={"type": "Unconfined"}), {"apparmor"}),
    "selinux": (_set(_vllm_sc, seLinuxOptions={"type": "spc_t"}), {"selinux"}),
    "proc mount": (_set(_vllm_sc, procMount="Unmasked"), {"proc mount"}),
    "seccomp": (_set(_agent_sc, seccompProfile={"type": "Unconfined"}), {"seccomp", "seccomp (restricted)"}),
    "sysctls": (_set(_pod_sc, sysctls=[{"name": "kernel.msgmax", "value": "65536"}]), {"sysctls"}),
    "volume types": (
        lambda pod: pod["spec"]["volumes"].append({"name": "nfs", "nfs": {"server": "nas", "path": "/"}}),
        {"volume types"},
    ),
    "privilege escalation": (_set(_agent_sc, allowPrivilegeEscalation=True), {"privilege escalation"}),
    "running as non-root": (_set(_agent_sc, runAsNonRoot=False), {"running as non-root"}),
    "running as non-root user": (_set(_pod_sc, runAsUser=0), {"running as non-root user"}),
    "seccomp (restricted)": (lambda pod: _pod_sc(pod).pop("seccompProfile"), {"seccomp (restricted)"}),
    "capabilities (restricted)": (_set(_vllm_sc, capabilities={"drop": []}), {"capabilities (restricted)"}),
}


def test_every_documented_rule_has_a_bad_pod() -> None:
    assert sorted(BAD_PODS) == sorted(RULES)


@pytest.mark.parametrize("rule", RULES)
def test_the_checker_catches_a_pod_breaking_each_rule(settings: Settings, rule: str) -> None:
    break_it, expected = BAD_PODS[rule]
    pod = copy.deepcopy(template(settings))
    break_it(pod)
    assert violations(pod) == expected


def test_the_checker_catches_an_init_container_and_an_apparmor_annotation(settings: Settings) -> None:
    pod = template(settings, model={"name": "org/m", "source": "s3://bucket/m"})
    pod["spec"]["initContainers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    pod["metadata"]["annotations"] = {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}
    assert violations(pod) == {"privilege escalation", "apparmor"}


# --- overrides --------------------------------------------------------------------------------------------------------


def test_overrides_merge_over_the_defaults_and_leave_the_agent_alone(settings: Settings) -> None:
    pod = template(
        settings,
        podSecurityContext={"runAsUser": 3000, "supplementalGroups": [44]},
        securityContext={"readOnlyRootFilesystem": False, "capabilities": {"add": ["NET_BIND_SERVICE"]}},
    )
    assert pod["spec"]["securityContext"] == {**security.POD_DEFAULTS, "runAsUser": 3000, "supplementalGroups": [44]}
    assert _vllm_sc(pod) == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "readOnlyRootFilesystem": False,
    }
    assert _agent_sc(pod) == security.CONTAINER_DEFAULTS


REFUSED = [
    ("pod-root-user", {"podSecurityContext": {"runAsUser": 0}}, "PodSecurityViolation", "runAsUser is 0"),
    ("pod-may-be-root", {"podSecurityContext": {"runAsNonRoot": False}}, "PodSecurityViolation", "runAsNonRoot"),
    ("container-root-user", {"securityContext": {"runAsUser": 0}}, "PodSecurityViolation", "runAsUser is 0"),
    ("privileged", {"securityContext": {"privileged": True}}, "PodSecurityViolation", "privileged"),
    (
        "escalation",
        {"securityContext": {"allowPrivilegeEscalation": True}},
        "PodSecurityViolation",
        "allowPrivilegeEscalation",
    ),
    ("cap-add", {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "PodSecurityViolation", "SYS_ADMIN"),
    ("cap-keep", {"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}, "PodSecurityViolation", "drop"),
    (
        "seccomp-off",
        {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "PodSecurityViolation",
        "Unconfined",
    ),
    ("proc-unmasked", {"securityContext": {"procMount": "Unmasked"}}, "PodSecurityViolation", "procMount"),
    (
        "selinux-super",
        {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
        "PodSecurityViolation",
        "seLinuxOptions",
    ),
    (
        "apparmor-off",
        {"podSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}},
        "PodSecurityViolation",
        "appArmor",
    ),
    (
        "unsafe-sysctl",
        {"podSecurityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
        "PodSecurityViolation",
        "kernel.msgmax",
    ),
    (
        "host-process",
        {"securityContext": {"windowsOptions": {"hostProcess": True}}},
        "PodSecurityViolation",
        "hostProcess",
    ),
    ("unknown-field", {"securityContext": {"runAsUserr": 5}}, "InvalidSecurityContext", "runAsUserr"),
    ("not-a-number", {"podSecurityContext": {"runAsUser": "2000"}}, "InvalidSecurityContext", "integer"),
]


@pytest.mark.parametrize(("case", "spec", "reason", "said"), REFUSED, ids=[case[0] for case in REFUSED])
def test_bad_overrides_are_refused_with_their_reason(
    settings: Settings, case: str, spec: dict[str, Any], reason: str, said: str
) -> None:
    with pytest.raises(SpecProblem) as caught:
        dep.deployment(make_spec(**spec), name="srv", namespace="ns", settings=settings)
    assert caught.value.reason == reason and said in caught.value.message, caught.value.message
