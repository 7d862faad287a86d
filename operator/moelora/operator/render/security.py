"""Security contexts of a server pod: the restricted Pod Security Standard by default, and the writable volumes
that lets vLLM run with a read-only root filesystem.

Users may merge their own `spec.podSecurityContext` and `spec.securityContext` (the vllm container's) over the
defaults; a result the restricted profile forbids is refused (`PodSecurityViolation`), an object Kubernetes would
not accept as a security context too (`InvalidSecurityContext`). The agent and the init container always run with
moelora's own settings: they need nothing more.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from moelora.api import ModelServerSpec
from moelora.operator.errors import SpecProblem

# The server image's user and group (the Dockerfile's server stage); numeric, so the kubelet can check runAsNonRoot.
SERVER_UID = 2000
# vLLM, Triton, torch and the Hugging Face hub write their caches under $HOME; Python, torch's inductor and vLLM's
# IPC under /tmp. Each gets an emptyDir, so the root filesystem can be read-only, whatever the image's user is.
HOME_DIR = "/home/moelora"
TMP_DIR = "/tmp"
HOME_VOLUME = "home"
TMP_VOLUME = "tmp"

POD_DEFAULTS: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": SERVER_UID,
    "runAsGroup": SERVER_UID,
    "fsGroup": SERVER_UID,
    # A model PVC can hold a million files: change their group only when its root does not have ours yet.
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_DEFAULTS: dict[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}

_POD_FIELDS = {
    "runAsNonRoot",
    "runAsUser",
    "runAsGroup",
    "fsGroup",
    "fsGroupChangePolicy",
    "supplementalGroups",
    "supplementalGroupsPolicy",
    "seccompProfile",
    "seLinuxOptions",
    "seLinuxChangePolicy",
    "appArmorProfile",
    "sysctls",
    "windowsOptions",
}
_CONTAINER_FIELDS = {
    "runAsNonRoot",
    "runAsUser",
    "runAsGroup",
    "allowPrivilegeEscalation",
    "privileged",
    "capabilities",
    "readOnlyRootFilesystem",
    "procMount",
    "seccompProfile",
    "seLinuxOptions",
    "appArmorProfile",
    "windowsOptions",
}
# What the restricted profile allows (kubernetes.io/docs/concepts/security/pod-security-standards).
_ADDABLE_CAPABILITIES = {"NET_BIND_SERVICE"}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`: nested objects merged key by key, anything else (lists too) replaced."""
    result = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def pod_security_context(spec: ModelServerSpec) -> dict[str, Any]:
    return merge(POD_DEFAULTS, spec.pod_security_context)


def vllm_security_context(spec: ModelServerSpec) -> dict[str, Any]:
    return merge(CONTAINER_DEFAULTS, spec.security_context)


def _refuse(where: str, what: str) -> SpecProblem:
    return SpecProblem("PodSecurityViolation", f"{where}: {what}, which the restricted Pod Security Standard forbids")


def _check_shape(where: str, context: Mapping[str, Any], fields: set[str]) -> None:
    unknown = sorted(set(context) - fields)
    if unknown:
        raise SpecProblem("InvalidSecurityContext", f"{where} has unknown fields {unknown}")
    for key in ("seccompProfile", "seLinuxOptions", "appArmorProfile", "capabilities", "windowsOptions"):
        if key in context and not isinstance(context[key], Mapping):
            raise SpecProblem("InvalidSecurityContext", f"{where}.{key} must be an object")
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        if key in context and (isinstance(context[key], bool) or not isinstance(context[key], int)):
            raise SpecProblem("InvalidSecurityContext", f"{where}.{key} must be an integer")


def _check_common(where: str, context: Mapping[str, Any]) -> None:
    """The rules a pod's and a container's security context share."""
    if context.get("runAsNonRoot") is False:
        raise _refuse(where, "runAsNonRoot is false")
    if context.get("runAsUser") == 0:
        raise _refuse(where, "runAsUser is 0 (root)")
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost"):
        raise _refuse(where, f"seccompProfile.type is {seccomp}")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in _SELINUX_TYPES:
        raise _refuse(where, f"seLinuxOptions.type is {selinux['type']}")
    if selinux.get("user") or selinux.get("role"):
        raise _refuse(where, "seLinuxOptions sets a user or role")
    if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
        raise _refuse(where, "appArmorProfile.type is Unconfined")
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        raise _refuse(where, "windowsOptions.hostProcess is true")


def check_pod(context: Mapping[str, Any]) -> None:
    """Raise SpecProblem unless a merged pod security context fits the restricted profile."""
    where = "spec.podSecurityContext"
    _check_shape(where, context, _POD_FIELDS)
    _check_common(where, context)
    if context.get("runAsNonRoot") is not True:
        raise _refuse(where, "runAsNonRoot is not true")
    if (context.get("seccompProfile") or {}).get("type") is None:
        raise _refuse(where, "seccompProfile.type is unset")
    for sysctl in context.get("sysctls") or []:
        name = sysctl.get("name") if isinstance(sysctl, Mapping) else None
        if name not in _SAFE_SYSCTLS:
            raise _refuse(where, f"sysctl {name} is not one of the safe set")


def check_container(context: Mapping[str, Any]) -> None:
    """Raise SpecProblem unless a merged container security context fits the restricted profile."""
    where = "spec.securityContext"
    _check_shape(where, context, _CONTAINER_FIELDS)
    _check_common(where, context)
    if context.get("privileged"):
        raise _refuse(where, "privileged is true")
    if context.get("allowPrivilegeEscalation") is not False:
        raise _refuse(where, "allowPrivilegeEscalation is not false")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        raise _refuse(where, "capabilities.drop does not include ALL")
    added = set(capabilities.get("add") or []) - _ADDABLE_CAPABILITIES
    if added:
        raise _refuse(where, f"capabilities.add has {sorted(added)}")
    if context.get("procMount", "Default") != "Default":
        raise _refuse(where, f"procMount is {context['procMount']}")


def check(spec: ModelServerSpec) -> None:
    """Raise SpecProblem if the spec's security overrides break the restricted profile."""
    check_pod(pod_security_context(spec))
    check_container(vllm_security_context(spec))


def secure(pod_spec: Mapping[str, Any], spec: ModelServerSpec, *, server_container: str) -> dict[str, Any]:
    """A copy of `pod_spec` with the security contexts, and the writable volumes the read-only root needs: /tmp in
    every container, $HOME (set explicitly, so any image's user finds it writable) in the server container, the
    only one whose context the spec may change. Checks first (raises SpecProblem)."""
    check(spec)
    result = copy.deepcopy(dict(pod_spec))
    result["securityContext"] = pod_security_context(spec)
    result["volumes"] = [*result.get("volumes", []), {"name": TMP_VOLUME, "emptyDir": {}}]
    tmp_mount = {"name": TMP_VOLUME, "mountPath": TMP_DIR}
    for container in result.get("initContainers", []):
        container["securityContext"] = copy.deepcopy(CONTAINER_DEFAULTS)
        container["volumeMounts"] = [*container.get("volumeMounts", []), tmp_mount]
    for container in result["containers"]:
        container["volumeMounts"] = [*container.get("volumeMounts", []), tmp_mount]
        if container["name"] != server_container:
            container["securityContext"] = copy.deepcopy(CONTAINER_DEFAULTS)
            continue
        container["securityContext"] = vllm_security_context(spec)
        container["volumeMounts"].append({"name": HOME_VOLUME, "mountPath": HOME_DIR})
        container["env"] = [{"name": "HOME", "value": HOME_DIR}, *container.get("env", [])]
        result["volumes"].append({"name": HOME_VOLUME, "emptyDir": {}})
    return result
