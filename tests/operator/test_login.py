"""The operator's API client and kopf's connection come from one configuration."""

from __future__ import annotations

import pathlib

import yaml

from moelora.operator.control import wiring
from moelora.operator.control.context import Context
from moelora.operator.settings import Settings


def test_kopf_connects_with_the_kubeconfigs_token(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {"name": "k", "cluster": {"server": "https://api.example:6443", "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "s3cr3t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    memo = Context.open(Settings(kubeconfig=str(path)))
    try:
        info = wiring.login(memo=memo)
        assert (info.server, info.scheme, info.token, info.insecure) == (
            "https://api.example:6443",
            "Bearer",
            "s3cr3t",
            True,
        )
        assert memo.api.configuration.host == "https://api.example:6443"
    finally:
        memo.close()
