"""examples/local/ (what `python -m moelora.local` applies) is valid against the CRDs and equals the builders."""

from __future__ import annotations

import pathlib

import yaml

from moelora.api.crd import custom_resource_definitions
from moelora.local import manifests
from moelora.local.__main__ import ADAPTERS, DEFAULT_MANIFESTS, EXAMPLE_S3, SERVER, _example_text
from moelora.local.apiserver import apply_defaults, schema_errors

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "local"


def _objects() -> list[dict]:
    return [o for path in sorted(EXAMPLES.glob("*.yaml")) for o in yaml.safe_load_all(path.read_text()) if o]


def _schema(kind: str) -> dict:
    crd = next(c for c in custom_resource_definitions() if c["spec"]["names"]["kind"] == kind)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_examples_validate_against_the_crds() -> None:
    kinds = []
    for obj in _objects():
        kinds.append(obj["kind"])
        if obj["kind"] in ("ModelServer", "LoRAAdapter"):
            assert schema_errors(apply_defaults(obj, _schema(obj["kind"])), _schema(obj["kind"])) == []
    assert sorted(kinds) == ["LoRAAdapter", "LoRAAdapter", "ModelServer", "Secret"]


def test_examples_equal_the_builders() -> None:
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in _objects()}
    assert (
        by_name[("ModelServer", SERVER)]["spec"]
        == manifests.model_server(name=SERVER, s3_endpoint=EXAMPLE_S3, moe=True)["spec"]
    )
    for name in ADAPTERS:
        assert by_name[("LoRAAdapter", name)] == manifests.adapter(
            name=name, model_server=SERVER, uri=manifests.adapter_uri(name)
        )
    assert (
        by_name[("Secret", manifests.S3_SECRET)]["data"].keys()
        == manifests.s3_secret(access_key_id="a", secret_access_key="b")["data"].keys()
    )


def test_example_text_points_at_this_runs_s3() -> None:
    text = _example_text("http://127.0.0.1:41234", folder=EXAMPLES)
    assert "http://127.0.0.1:41234" in text and EXAMPLE_S3 not in text


def test_servers_are_applied_before_their_adapters_whatever_the_file_names(tmp_path: pathlib.Path) -> None:
    kinds = [o["kind"] for o in yaml.safe_load_all(_example_text("http://127.0.0.1:41234", folder=EXAMPLES))]
    assert kinds == ["Secret", "ModelServer", "LoRAAdapter", "LoRAAdapter"]  # adapters.yaml sorts first by name
    # Within one file too, and other kinds keep their place ahead of both.
    (tmp_path / "a.yaml").write_text(
        yaml.safe_dump_all([*(o for o in _objects() if o["kind"] != "Secret"), {"kind": "ConfigMap"}])
    )
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(next(o for o in _objects() if o["kind"] == "Secret")))
    objects = list(yaml.safe_load_all(_example_text("http://127.0.0.1:41234", folder=tmp_path)))
    assert [o["kind"] for o in objects] == ["ConfigMap", "Secret", "ModelServer", "LoRAAdapter", "LoRAAdapter"]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "LoRAAdapter"] == list(ADAPTERS)
    dense = [o["kind"] for o in yaml.safe_load_all(_example_text("http://127.0.0.1:41234", folder=None))]
    assert dense.index("ModelServer") < dense.index("LoRAAdapter")


def test_dense_variant_is_the_llama_without_the_plugin() -> None:
    objects = list(yaml.safe_load_all(_example_text("http://127.0.0.1:41234", folder=None)))
    server = next(o for o in objects if o["kind"] == "ModelServer")
    assert server["spec"]["model"]["name"] == manifests.BASE_MODEL_NAME
    assert server["spec"].get("kernels") is None
    assert {o["spec"]["modelServer"] for o in objects if o["kind"] == "LoRAAdapter"} == {server["metadata"]["name"]}
    assert server["spec"]["s3"]["endpointUrl"] == "http://127.0.0.1:41234"


def test_the_default_manifests_folder_is_examples_local_from_the_repositorys_root() -> None:
    assert (ROOT / DEFAULT_MANIFESTS).resolve() == EXAMPLES
