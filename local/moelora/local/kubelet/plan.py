"""The pure part of running a pod locally: a Pod object -> a `PodPlan` of processes, directories and ports.

Each container runs exactly as rendered: its `command` and `args` and `env`, with only these translations from a
pod to one machine:
- `python3` as the first word of the command becomes this interpreter (`sys.executable`), so the local venv runs it;
  paths of this machine (the interpreter, `base_env` and `extra_env`) are never rewritten, only the pod's own;
- downward-API env (`fieldRef`) gets the Pod object's namespace, name, uid, and `127.0.0.1` for IPs;
- `secretKeyRef` env is read through the caller's `secret` function (optional keys may be absent);
- each volume is a directory: for a `persistentVolumeClaim` the local directory `claims` names, for any other kind
  an empty one under the pod's own root; every `mountPath` is rewritten to that directory wherever it starts a path
  inside args or env values (`/models/x` -> `<root>/volumes/models/x`);
- ports: two replicas side by side cannot both listen on 8000, so every `containerPort` of the pod gets its own
  free local port, and the same mapping is applied everywhere the pod names that port: an arg that is the port
  (`--port 8000`, `--port=8000`), a `:8000` inside an arg or env value (`http://127.0.0.1:8000`), and the probes
  (named or numbered ports). Containers of one pod share 127.0.0.1 as they share a network namespace in a cluster.
- `extra_env` adds variables per container (the stack gives the agent `KUBECONFIG`, standing in for the in-cluster
  service account).
The pod's `terminationGracePeriodSeconds` (Kubernetes' 30 when absent) is kept as the plan's `grace`, a container's
preStop `sleep` action as its `pre_stop_sleep` (the other preStop actions are not emulated).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

LOCAL_NODE = "moelora-local"
DEFAULT_GRACE = 30.0  # the API server's default terminationGracePeriodSeconds


@dataclasses.dataclass(frozen=True)
class Probe:
    """An httpGet probe resolved to a local URL."""

    url: str
    failure_threshold: int = 3


@dataclasses.dataclass(frozen=True)
class ContainerPlan:
    """One container as a local process: its argv and environment after the translations, its probes."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    startup: Probe | None = None
    readiness: Probe | None = None
    pre_stop_sleep: float = 0.0  # seconds its preStop hook waits before the container gets SIGTERM


@dataclasses.dataclass(frozen=True)
class PodPlan:
    """What running one pod locally means: its processes, where its volumes are, which local ports it uses."""

    name: str
    init_containers: tuple[ContainerPlan, ...]
    containers: tuple[ContainerPlan, ...]
    volumes: Mapping[str, pathlib.Path]  # volume name -> directory
    ports: Mapping[int, int]  # containerPort -> local port
    grace: float = DEFAULT_GRACE  # seconds from SIGTERM to SIGKILL when the pod is deleted


def _field_value(path: str, *, pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    values = {
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.name": meta.get("name", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": LOCAL_NODE,
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path not in values:
        raise ValueError(f"downward API field {path!r} is not emulated")
    return str(values[path])


def _rewriter(*, mounts: Mapping[str, pathlib.Path], ports: Mapping[int, int]) -> Callable[[str], str]:
    """A function applying the mount-path and port translations (see the module docstring) to one string."""
    # One pattern, longest mount path first (so /var/lib/x/y wins over /var/lib/x), applied in one pass: a local
    # directory under /tmp must not be rewritten again by a volume mounted at /tmp.
    local_of = {mount.rstrip("/"): str(local) for mount, local in mounts.items()}
    alternatives = "|".join(re.escape(mount) for mount in sorted(local_of, key=len, reverse=True))
    path_rule = re.compile(r"(?<![\w.\-/])(" + alternatives + r")(?=/|$|[\s,:;])") if local_of else None
    port_rules = [
        (re.compile(r"(?<=:)" + str(container) + r"(?!\d)"), str(local)) for container, local in ports.items()
    ]

    def rewrite(value: str) -> str:
        for container, local in ports.items():
            if value == str(container):
                return str(local)
            flag, sep, tail = value.partition("=")
            if sep and flag.startswith("-") and tail == str(container):
                return f"{flag}={local}"
        if path_rule is not None:
            value = path_rule.sub(lambda match: local_of[match.group(1)], value)
        for pattern, local in port_rules:
            value = pattern.sub(local, value)
        return value

    return rewrite


def plan_pod(
    *,
    pod: Mapping[str, Any],
    root: pathlib.Path,
    ports: Mapping[int, int],
    secret: Callable[[str, str], str | None],
    claims: Mapping[str, pathlib.Path] = {},
    base_env: Mapping[str, str] = {},
    extra_env: Mapping[str, Mapping[str, str]] = {},
) -> PodPlan:
    """Translate a Pod object (metadata + the Deployment template's spec) into local processes. Pure but for
    `secret(name, key)` (None when the key or Secret is absent).

    `ports` maps every containerPort of the pod to a local port; `claims` maps PVC names to directories;
    `base_env` is the environment every container starts from (what an image would set, e.g. PATH, HOME);
    `extra_env` adds variables per container name. Raises ValueError for what cannot run locally.
    """
    spec = pod.get("spec") or {}
    volumes: dict[str, pathlib.Path] = {}
    for volume in spec.get("volumes") or []:
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in claims:
                raise ValueError(f"volume {volume['name']}: no local directory for PersistentVolumeClaim {claim!r}")
            volumes[volume["name"]] = claims[claim]
        else:
            volumes[volume["name"]] = root / "volumes" / volume["name"]
    all_containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    port_names = {
        p["name"]: int(p["containerPort"]) for c in all_containers for p in c.get("ports") or [] if "name" in p
    }

    def container_plan(container: Mapping[str, Any]) -> ContainerPlan:
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            local = volumes[mount["name"]]
            if mount.get("subPath"):
                local = local / mount["subPath"]
            mounts[mount["mountPath"]] = local
        rewrite = _rewriter(mounts=mounts, ports=ports)
        command = list(container.get("command") or [])
        if not command:
            raise ValueError(f"container {container['name']}: no command (image entrypoints are not emulated)")
        argv = tuple(rewrite(word) for word in [*command, *(container.get("args") or [])])
        if command[0] in ("python3", "python"):
            # After the rewrite: the venv is a path of this machine, not of the pod, wherever the checkout is (a
            # clone under /tmp would otherwise land in the pod's /tmp emptyDir).
            argv = (sys.executable, *argv[1:])
        env = dict(base_env)
        for var in container.get("env") or []:
            name, source = var["name"], var.get("valueFrom")
            if source is None:
                env[name] = rewrite(str(var.get("value", "")))
            elif "fieldRef" in source:
                env[name] = _field_value(source["fieldRef"]["fieldPath"], pod=pod)
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = secret(ref["name"], ref["key"])
                if value is None:
                    if ref.get("optional"):
                        continue
                    raise ValueError(
                        f"container {container['name']}: env {name}: Secret {ref['name']!r} has no key {ref['key']!r}"
                    )
                env[name] = value
            else:
                raise ValueError(f"container {container['name']}: env {name}: {sorted(source)} is not emulated")
        env.update(extra_env.get(container["name"], {}))

        def probe(kind: str) -> Probe | None:
            spec_probe = container.get(kind)
            if not spec_probe:
                return None
            http = spec_probe.get("httpGet")
            if http is None:
                raise ValueError(f"container {container['name']}: {kind}: only httpGet probes are emulated")
            port = http["port"]
            container_port = port_names[port] if isinstance(port, str) and not port.isdigit() else int(port)
            return Probe(
                url=f"http://127.0.0.1:{ports[container_port]}{http.get('path', '/')}",
                failure_threshold=int(spec_probe.get("failureThreshold", 3)),
            )

        pre_stop = (container.get("lifecycle") or {}).get("preStop") or {}
        if set(pre_stop) - {"sleep"}:
            raise ValueError(f"container {container['name']}: preStop: only the sleep action is emulated")
        return ContainerPlan(
            name=container["name"],
            argv=argv,
            env=env,
            startup=probe("startupProbe"),
            readiness=probe("readinessProbe"),
            pre_stop_sleep=float((pre_stop.get("sleep") or {}).get("seconds", 0)),
        )

    return PodPlan(
        name=(pod.get("metadata") or {})["name"],
        init_containers=tuple(container_plan(c) for c in spec.get("initContainers") or []),
        containers=tuple(container_plan(c) for c in spec.get("containers") or []),
        volumes=volumes,
        ports=dict(ports),
        grace=float(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE)),
    )


def container_ports(template_spec: Mapping[str, Any]) -> list[int]:
    """Every containerPort a pod declares (init containers included), each once."""
    found = []
    for container in [*(template_spec.get("initContainers") or []), *(template_spec.get("containers") or [])]:
        for port in container.get("ports") or []:
            if int(port["containerPort"]) not in found:
                found.append(int(port["containerPort"]))
    return found


def template_hash(template: Mapping[str, Any]) -> str:
    """A short hash of a pod template, like the pod-template-hash label of a ReplicaSet."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
