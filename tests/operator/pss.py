"""A checker of the restricted Pod Security Standard, written from its documented rules
(kubernetes.io/docs/concepts/security/pod-security-standards), independent of the operator's own validation.

`violations(template)` takes a pod template (metadata + spec) and returns the names of the rules it breaks, so a
test can show both that rendered pods pass and that each rule catches a pod built to break it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SAFE_SYSCTLS = {
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
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}

RULES = (
    "host namespaces",
    "privileged containers",
    "capabilities",
    "hostpath volumes",
    "host ports",
    "apparmor",
    "selinux",
    "proc mount",
    "seccomp",
    "sysctls",
    "volume types",
    "privilege escalation",
    "running as non-root",
    "running as non-root user",
    "seccomp (restricted)",
    "capabilities (restricted)",
)


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _contexts(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pod's security context, then every container's (empty where unset)."""
    yield spec.get("securityContext") or {}
    for container in _containers(spec):
        yield container.get("securityContext") or {}


def violations(template: dict[str, Any]) -> set[str]:
    """The restricted rules the pod template breaks (empty: the restricted namespace admits it)."""
    spec, metadata = template["spec"], template.get("metadata") or {}
    pod_sc = spec.get("securityContext") or {}
    containers = list(_containers(spec))
    container_scs = [c.get("securityContext") or {} for c in containers]
    broken: set[str] = set()

    # --- baseline ---
    if any(spec.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        broken.add("host namespaces")
    if any(sc.get("privileged") for sc in container_scs) or (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        broken.add("privileged containers")
    if any(set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES for sc in container_scs):
        broken.add("capabilities")
    if any("hostPath" in volume for volume in spec.get("volumes") or []):
        broken.add("hostpath volumes")
    if any(port.get("hostPort") for c in containers for port in c.get("ports") or []):
        broken.add("host ports")
    apparmor_annotations = {
        value
        for key, value in (metadata.get("annotations") or {}).items()
        if key.startswith("container.apparmor.security.beta.kubernetes.io/")
    }
    if any(
        (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost")
        for sc in _contexts(spec)
    ) or any(value != "runtime/default" and not value.startswith("localhost/") for value in apparmor_annotations):
        broken.add("apparmor")
    for sc in _contexts(spec):
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            broken.add("selinux")
    if any(sc.get("procMount", "Default") != "Default" for sc in container_scs):
        broken.add("proc mount")
    if any((sc.get("seccompProfile") or {}).get("type") == "Unconfined" for sc in _contexts(spec)):
        broken.add("seccomp")
    if any(sysctl.get("name") not in SAFE_SYSCTLS for sysctl in pod_sc.get("sysctls") or []):
        broken.add("sysctls")

    # --- restricted ---
    for volume in spec.get("volumes") or []:
        if not set(volume) - {"name"} <= RESTRICTED_VOLUMES:
            broken.add("volume types")
    if any(sc.get("allowPrivilegeEscalation") is not False for sc in container_scs):
        broken.add("privilege escalation")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    if any(sc.get("runAsNonRoot") is False for sc in container_scs) or not (
        pod_non_root or all(sc.get("runAsNonRoot") is True for sc in container_scs)
    ):
        broken.add("running as non-root")
    if any(sc.get("runAsUser") == 0 for sc in _contexts(spec)):
        broken.add("running as non-root user")
    allowed = ("RuntimeDefault", "Localhost")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    container_seccomp = [(sc.get("seccompProfile") or {}).get("type") for sc in container_scs]
    if any(kind is not None and kind not in allowed for kind in container_seccomp) or not (
        pod_seccomp in allowed or all(kind in allowed for kind in container_seccomp)
    ):
        broken.add("seccomp (restricted)")
    for sc in container_scs:
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []) or set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            broken.add("capabilities (restricted)")
    return broken
