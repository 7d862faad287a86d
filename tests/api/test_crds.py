"""The generated CRDs: current, structural, and rejecting what a real API server would reject.

The API server is not available here, so its checks are re-done the same way it does them: defaults applied from
the schema, then the openAPIV3Schema (jsonschema), then the x-kubernetes-validations CEL rules (cel-python).
"""

from __future__ import annotations

import copy
import pathlib
import re
from typing import Any

import celpy
import pytest
import yaml

from moelora.api import __main__ as generator
from moelora.api.crd import custom_resource_definitions, render_yaml
from moelora.local.apiserver import apply_defaults, schema_errors

ROOT = pathlib.Path(__file__).parents[2]
CRDS = {crd["spec"]["names"]["kind"]: crd for crd in custom_resource_definitions()}


def schema_of(kind: str) -> dict[str, Any]:
    return CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def errors(obj: dict[str, Any]) -> list[str]:
    obj = apply_defaults(copy.deepcopy(obj), schema_of(obj["kind"]))
    return schema_errors(obj, schema_of(obj["kind"]))


# --- current ----------------------------------------------------------------------------------------------------------


def test_crd_files_are_current(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert generator.main(["--check"]) == 0, "crds/ is stale: run python -m moelora.api"


def test_check_fails_on_a_stale_file(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(generator, "TARGETS", (tmp_path,))
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
    stale = tmp_path / "modelservers.yaml"
    stale.write_text(stale.read_text().replace("maxLoras", "maxLoraz", 1))
    assert generator.main(["--check"]) == 1


def test_files_load_as_the_generated_objects() -> None:
    for kind, crd in CRDS.items():
        on_disk = yaml.safe_load((ROOT / "crds" / f"{crd['spec']['names']['plural']}.yaml").read_text())
        assert on_disk == crd, kind


# --- structural -----------------------------------------------------------------------------------------------------

FORBIDDEN = {"$ref", "anyOf", "oneOf", "allOf", "not", "definitions", "$defs", "title", "const"}


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for key, sub in (node.get("properties") or {}).items():
        found += walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += walk(node["additionalProperties"], f"{path}{{}}")
    return found


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_schema_is_structural(kind: str) -> None:
    for path, node in walk(schema_of(kind)):
        assert not FORBIDDEN & set(node), f"{path or '<root>'} has {FORBIDDEN & set(node)}"
        assert (
            node.get("type")
            or node.get("x-kubernetes-preserve-unknown-fields")
            or node.get("x-kubernetes-int-or-string")
        ), f"{path or '<root>'} has no type"
        if node.get("type") == "object" and "properties" in node and "additionalProperties" in node:
            pytest.fail(f"{path}: properties and additionalProperties are mutually exclusive")
        for required in node.get("required") or []:
            assert required in (node.get("properties") or {}), f"{path} requires unknown {required}"
        if "pattern" in node:
            re.compile(node["pattern"])
        if "enum" in node:
            assert all(isinstance(value, type(node["enum"][0])) for value in node["enum"])


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_defaults_are_valid_as_written(kind: str) -> None:
    """The API server checks each default as written, CEL rules included, without defaulting it first: so every
    object default carries its nested defaults, and passes its node's schema and rules as it stands."""
    for path, node in walk(schema_of(kind)):
        if "default" in node:
            written = node["default"]
            assert apply_defaults(copy.deepcopy(written), node) == written, f"{path}: nested defaults left out"
            assert schema_errors(copy.deepcopy(written), {k: v for k, v in node.items() if k != "default"}) == [], path


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_cel_rules_compile(kind: str) -> None:
    env = celpy.Environment()
    rules = [rule for _, node in walk(schema_of(kind)) for rule in node.get("x-kubernetes-validations") or []]
    assert rules
    for rule in rules:
        env.compile(rule["rule"])
        assert rule["message"]


def test_names_subresources_and_columns() -> None:
    ms, lora = CRDS["ModelServer"], CRDS["LoRAAdapter"]
    assert (ms["spec"]["group"], ms["spec"]["names"]["shortNames"], lora["spec"]["names"]["shortNames"]) == (
        "moelora.io",
        ["ms"],
        ["lora"],
    )
    version = ms["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    scale = version["subresources"]["scale"]
    props = schema_of("ModelServer")["properties"]
    assert (
        props["spec"]["properties"]["replicas"]["type"] == "integer" and scale["specReplicasPath"] == ".spec.replicas"
    )
    assert props["status"]["properties"]["replicas"]["type"] == "integer"
    assert props["status"]["properties"]["selector"]["type"] == "string"
    assert "status" in lora["spec"]["versions"][0]["subresources"]
    for crd in CRDS.values():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
            # metadata is the API server's own schema, not in the CRD's: only creationTimestamp is used.
            node: dict[str, Any] = {
                "properties": {
                    **schema["properties"],
                    "metadata": {"properties": {"creationTimestamp": {"type": "string"}}},
                }
            }
            for part in re.sub(r"\[\?.*?\]", "", column["jsonPath"]).strip(".").split("."):
                node = (node.get("properties") or {}).get(part) or node.get("items", {}).get("properties", {}).get(part)
                assert node is not None, f"{column['name']}: {column['jsonPath']} is not in the schema"


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_every_field_is_described_for_kubectl_explain(kind: str) -> None:
    schema = schema_of(kind)
    undescribed = [
        path or "<root>"
        for path, node in walk(schema)
        # Items and map values without fields of their own (strings, free-form objects) are explained by their field;
        # metadata may not be described (the server refuses it) and is explained by the server's ObjectMeta.
        if not str(node.get("description", "")).strip()
        and (not path.endswith(("[]", "{}")) or "properties" in node)
        and path != ".metadata"
    ]
    assert undescribed == []
    assert len(walk(schema)) > 40


def test_conditions_are_a_map_keyed_by_type() -> None:
    for kind in CRDS:
        conditions = schema_of(kind)["properties"]["status"]["properties"]["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        # The API server refuses a list-map key that is neither required nor defaulted.
        assert "type" in conditions["items"]["required"] and "default" not in conditions["items"]["properties"]["type"]


@pytest.mark.parametrize(
    "path",
    [
        path
        for folder in ("crds", "charts/moelora/files/crds", "charts/moelora/crds")
        for path in sorted((ROOT / folder).glob("*.yaml"))
    ],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_generated_yaml_has_no_anchors_or_aliases(path: pathlib.Path) -> None:
    events = list(yaml.parse(path.read_text()))
    assert not [event for event in events if isinstance(event, yaml.AliasEvent)]
    assert not [event for event in events if getattr(event, "anchor", None)]


def test_a_value_used_twice_is_written_twice() -> None:
    shared = ["Pending", "Loaded"]
    text = render_yaml({"a": shared, "b": shared})
    assert "&" not in text and "*" not in text
    assert yaml.safe_load(text) == {"a": shared, "b": shared}


def test_kubectl_get_lora_shows_loaded_and_desired_replicas() -> None:
    columns = {c["name"]: c for c in CRDS["LoRAAdapter"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    status = schema_of("LoRAAdapter")["properties"]["status"]["properties"]
    for name, field in (("Loaded", "loadedReplicas"), ("Desired", "desiredReplicas")):
        assert (columns[name]["type"], columns[name]["jsonPath"]) == ("integer", f".status.{field}")
        assert status[field]["type"] == "integer"


# --- bad input ------------------------------------------------------------------------------------------------------


def server(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "srv"},
        "spec": {"model": {"name": "org/m"}, **spec},
    }


def adapter(**spec: Any) -> dict[str, Any]:
    body = {"modelServer": "srv", "source": {"uri": "s3://bucket/a/"}}
    body.update(spec)
    return {"apiVersion": "moelora.io/v1alpha1", "kind": "LoRAAdapter", "metadata": {"name": "a"}, "spec": body}


INVALID = [
    # (id, object, where the error is, what it says)
    (
        "no-spec",
        {"apiVersion": "moelora.io/v1alpha1", "kind": "ModelServer", "metadata": {"name": "srv"}},
        "<root>",
        "'spec' is a required property",
    ),
    ("no-model", server(model=None) | {"spec": {}}, ".spec", "'model' is a required property"),
    ("empty-model-name", server(model={"name": ""}), ".spec.model.name", "should be non-empty"),
    ("bad-model-source", server(model={"name": "m", "source": "ftp://x/y"}), ".spec.model.source", "does not match"),
    ("negative-replicas", server(replicas=-1), ".spec.replicas", "less than the minimum of 0"),
    ("too-many-gpus", server(gpus=17), ".spec.gpus", "greater than the maximum of 16"),
    ("replicas-string", server(replicas="two"), ".spec.replicas", "is not of type 'integer'"),
    ("rank-not-allowed", server(lora={"maxLoraRank": 24}), ".spec.lora.maxLoraRank", "is not one of"),
    ("max-loras-zero", server(lora={"maxLoras": 0}), ".spec.lora.maxLoras", "less than the minimum of 1"),
    (
        "cpu-loras-below-loras",
        server(lora={"maxLoras": 8, "maxCpuLoras": 4}),
        ".spec.lora.maxCpuLoras",
        "maxCpuLoras must be at least maxLoras",
    ),
    (
        "home-routing-without-placement",
        server(routing={"gateway": {"enabled": True, "parentRefs": [{"name": "gw"}], "routeToHome": True}}),
        ".spec.routing.gateway.routeToHome",
        "routing.gateway.routeToHome needs spec.placement",
    ),
    ("kernel-mode-unknown", server(kernels={"configs": "magic"}), ".spec.kernels.configs", "is not one of"),
    (
        "configmap-without-name",
        server(kernels={"configs": "configMap"}),
        ".spec.kernels.configMapName",
        "configMapName is required when configs is configMap",
    ),
    (
        "name-without-configmap-mode",
        server(kernels={"configs": "auto", "configMapName": "x"}),
        ".spec.kernels.configMapName",
        "and only then",
    ),
    (
        "int8-expert-lora-without-moelora-kernel",
        server(kernels={"implementation": "vllm", "expertLoraWeights": "int8"}),
        ".spec.kernels.expertLoraWeights",
        "expertLoraWeights int8 needs implementation moelora",
    ),
    (
        "int8-expert-lora-with-the-default-kernel",
        server(kernels={"expertLoraWeights": "int8"}),
        ".spec.kernels.expertLoraWeights",
        "expertLoraWeights int8 needs implementation moelora",
    ),
    (
        "expert-lora-weights-unknown",
        server(kernels={"expertLoraWeights": "fp8"}),
        ".spec.kernels.expertLoraWeights",
        "is not one of",
    ),
    (
        "bad-quantity",
        server(resources={"limits": {"memory": "lots"}}),
        ".spec.resources.limits.memory",
        "does not match",
    ),
    ("bad-cache-size", server(adapterCache={"sizeLimit": "20 GB"}), ".spec.adapterCache.sizeLimit", "does not match"),
    ("engine-args-not-strings", server(engineArgs=[8192]), ".spec.engineArgs[0]", "is not of type 'string'"),
    ("bad-env-name", server(env=[{"name": "1BAD"}]), ".spec.env[0].name", "does not match"),
    (
        "bad-secret-name",
        server(s3={"credentialsSecret": {"name": "Not_A_Name"}}),
        ".spec.s3.credentialsSecret.name",
        "does not match",
    ),
    ("bad-endpoint", server(s3={"endpointUrl": "minio:9000"}), ".spec.s3.endpointUrl", "does not match"),
    (
        "env-value-and-value-from",
        server(env=[{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
        ".spec.env[0]",
        "exactly one of value and valueFrom",
    ),
    ("env-neither", server(env=[{"name": "A"}]), ".spec.env[0]", "exactly one of value and valueFrom"),
    (
        "env-two-sources",
        server(
            env=[
                {
                    "name": "A",
                    "valueFrom": {
                        "secretKeyRef": {"name": "s", "key": "k"},
                        "configMapKeyRef": {"name": "c", "key": "k"},
                    },
                }
            ]
        ),
        ".spec.env[0].valueFrom",
        "exactly one of secretKeyRef",
    ),
    (
        "env-from-both",
        server(envFrom=[{"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}]),
        ".spec.envFrom[0]",
        "exactly one of secretRef and configMapRef",
    ),
    (
        "token-bad-secret-name",
        server(model={"name": "m", "tokenSecret": {"name": "HF"}}),
        ".spec.model.tokenSecret.name",
        "does not match",
    ),
    (
        "pull-secret-no-name",
        server(imagePullSecrets=[{}]),
        ".spec.imagePullSecrets[0]",
        "'name' is a required property",
    ),
    (
        "gateway-without-parents",
        server(routing={"gateway": {"enabled": True}}),
        ".spec.routing.gateway.parentRefs",
        "parentRefs names at least one Gateway",
    ),
    (
        "epp-failure-mode-unknown",
        server(routing={"gateway": {"endpointPicker": {"failureMode": "FailSoft"}}}),
        ".spec.routing.gateway.endpointPicker.failureMode",
        "is not one of",
    ),
    (
        "autoscaling-max-below-min",
        server(autoscaling={"minReplicas": 3, "maxReplicas": 2}),
        ".spec.autoscaling.maxReplicas",
        "maxReplicas must be at least minReplicas",
    ),
    (
        "hpa-to-zero",
        server(autoscaling={"minReplicas": 0, "maxReplicas": 2}),
        ".spec.autoscaling.minReplicas",
        "minReplicas 0 needs engine keda",
    ),
    (
        "keda-to-zero-without-a-wake-query",
        server(
            autoscaling={
                "engine": "keda",
                "minReplicas": 0,
                "maxReplicas": 2,
                "target": {"prometheusAddress": "http://p:9090"},
            }
        ),
        ".spec.autoscaling.target.wakeQuery",
        "minReplicas 0 needs target.wakeQuery",
    ),
    (
        "keda-without-prometheus",
        server(autoscaling={"engine": "keda", "maxReplicas": 2}),
        ".spec.autoscaling.target.prometheusAddress",
        "engine keda needs target.prometheusAddress",
    ),
    ("zero-nodes", server(nodes=0), ".spec.nodes", "less than the minimum of 1"),
    ("server-name-too-long", server() | {"metadata": {"name": "x" * 53}}, "<root>", "at most 52 characters"),
    ("server-name-uppercase", server() | {"metadata": {"name": "Srv"}}, "<root>", "DNS-1035 label"),
    (
        "adapter-no-server",
        adapter(modelServer=None) | {"spec": {"source": {"uri": "s3://bucket/a/"}}},
        ".spec",
        "'modelServer' is a required property",
    ),
    ("adapter-not-s3", adapter(source={"uri": "https://bucket/a"}), ".spec.source.uri", "does not match"),
    ("adapter-bad-server-name", adapter(modelServer="My_Server"), ".spec.modelServer", "does not match"),
    (
        "adapter-two-pins",
        adapter(pin={"etag": "abc", "sha256": "0" * 64}),
        ".spec.pin",
        "exactly one of etag and sha256",
    ),
    ("adapter-no-pin", adapter(pin={}), ".spec.pin", "exactly one of etag and sha256"),
    ("adapter-bad-sha", adapter(pin={"sha256": "XYZ"}), ".spec.pin.sha256", "does not match"),
    ("adapter-bad-served-name", adapter(servedName="-lead"), ".spec.servedName", "does not match"),
]


@pytest.mark.parametrize(("obj", "where", "says"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_objects_are_rejected_with_a_useful_path_and_message(
    obj: dict[str, Any], where: str, says: str
) -> None:
    found = errors(obj)
    assert found, "accepted an invalid object"
    assert any(error.startswith(f"{where}:") and says in error for error in found), found


def test_there_are_at_least_fifteen_cases() -> None:
    assert len(INVALID) >= 15


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT / "examples"))
)
def test_examples_are_valid(path: pathlib.Path) -> None:
    for obj in yaml.safe_load_all(path.read_text()):
        if obj and obj.get("apiVersion", "").startswith("moelora.io/"):
            assert errors(obj) == [], f"{path}: {obj['metadata']['name']}"


def test_defaults_fill_what_the_user_left_out() -> None:
    obj = apply_defaults(copy.deepcopy(server()), schema_of("ModelServer"))
    spec = obj["spec"]
    assert (spec["replicas"], spec["gpus"], spec["lora"]["maxLoras"], spec["lora"]["maxLoraRank"]) == (1, 1, 8, 16)
    assert spec["kernels"] == {"configs": "none", "implementation": "vllm", "expertLoraWeights": "model"}
    assert spec["adapterCache"] == {"sizeLimit": "20Gi"}


def test_int8_expert_lora_weights_are_admitted_with_the_moelora_kernel() -> None:
    assert errors(server(kernels={"implementation": "moelora", "expertLoraWeights": "int8"})) == []
    assert errors(server(kernels={"implementation": "moelora", "expertLoraWeights": "model"})) == []
    assert errors(server(kernels={"implementation": "vllm", "expertLoraWeights": "model"})) == []


def test_env_accepts_a_value_or_a_reference() -> None:
    refs = [
        {"name": "A", "value": ""},
        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "C", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
    ]
    good = server(
        env=refs, envFrom=[{"configMapRef": {"name": "c"}}], model={"name": "m", "tokenSecret": {"name": "hf"}}
    )
    assert errors(good) == []
    assert (
        apply_defaults(copy.deepcopy(good), schema_of("ModelServer"))["spec"]["model"]["tokenSecret"]["key"]
        == "HF_TOKEN"
    )
