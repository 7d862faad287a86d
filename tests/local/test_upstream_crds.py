"""The other projects' CRDs the emulator serves: vendored unmodified, loaded as published, every rule understood."""

from __future__ import annotations

import pathlib
import re

import pytest

from moelora.local.apiserver import celrules, upstream

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "upstream-crds"  # the copies this project was given, beside the checkout


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no {SHARED} beside this checkout (a fresh clone has none)")
def test_the_vendored_files_are_byte_identical_to_the_published_ones() -> None:
    published = sorted(path.name for path in SHARED.glob("*.yaml"))
    assert upstream.files() == published
    for name in published:
        assert (upstream.folder() / name).read_bytes() == (SHARED / name).read_bytes(), name


def test_the_readme_lists_every_file_and_the_license() -> None:
    readme = (upstream.folder() / "README.md").read_text()
    assert "Apache License, Version 2.0" in readme
    for name in upstream.files():
        stem = re.sub(r"-[a-z]+\.yaml$", "", name)
        assert stem in readme or name in readme, name
    assert set(upstream.PUBLISHED.values()) <= set(upstream.files())


@pytest.mark.parametrize("name", upstream.files())
def test_each_file_is_one_crd_whose_rules_all_compile_and_run(name: str) -> None:
    crd = upstream.crd(name)
    assert crd["kind"] == "CustomResourceDefinition"
    rules = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            rules.extend(rule["rule"] for rule in node.get("x-kubernetes-validations") or [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd)
    for rule in set(rules):
        celrules.compiled(rule)  # raises if cel-python cannot parse it
    served = upstream.served_versions(name)
    assert served and all(version.kind == crd["spec"]["names"]["kind"] for version in served)


def test_the_gateway_apis_rules_use_what_plain_cel_lacks() -> None:
    """Why the escaping and the library matter: HTTPRoute's rules reach `namespace` as `__namespace__` (a reserved
    word in CEL), and a parentRef with and without a namespace must then differ."""
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "ns"},
        "spec": {"parentRefs": [{"name": "gw", "namespace": "a"}, {"name": "gw", "namespace": "b"}]},
    }
    assert upstream.admission(route).errors == []  # without the escaping both refs read as namespace-less: refused
    same = {**route, "spec": {"parentRefs": [{"name": "gw", "namespace": "a"}, {"name": "gw", "namespace": "a"}]}}
    message = upstream.admission(same).message
    assert message == (
        'HTTPRoute.gateway.networking.k8s.io "r" is invalid: spec.parentRefs: Invalid value: sectionName must be '
        "unique when parentRefs includes 2 or more references to the same parent"
    )


def test_an_unknown_kind_is_named() -> None:
    with pytest.raises(KeyError, match="no published CRD vendored for kind 'Gateway'"):
        upstream.admission({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway"})
