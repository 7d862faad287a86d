"""The Helm chart, rendered offline by Helm's own engine (helm-python-sdk): what `helm install` would send.

Every rendered built-in object is validated against the Kubernetes OpenAPI schemas (kubernetes-validate, strict,
oldest supported and newest version); custom objects against the CRDs the chart ships. RBAC is compared rule by
rule with what the operator and the agent need, for each way the chart scopes it.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import urllib.parse
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from moelora.api.__main__ import rendered_files
from moelora.operator.settings import MAX_DRAIN_DELAY_SECONDS, Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "moelora"
NAMESPACE = "moelora-system"
KUBE_VERSIONS = ("1.31.0", "1.37.0")  # Chart.yaml's kubeVersion floor, and the newest schemas we have

LONG_RELEASE = "a-release-name-that-is-long-enough-to-need-truncation"  # 53: Helm's longest release name

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    # Several replicas watching two namespaces: namespaced peering, RBAC by RoleBindings.
    "ha-namespaced": {"operator": {"replicas": 3}, "watchNamespaces": ["ml-a", "ml-b"]},
    # Several replicas watching everything: cluster-wide peering.
    "ha-clusterwide": {"operator": {"replicas": 2}},
    # Bring-your-own everything, with a name long enough to truncate.
    "custom": {
        "fullnameOverride": LONG_RELEASE + "-and-then-some-more-characters",
        "commonLabels": {"team": "ml-platform"},
        "crds": {"enabled": False},
        "operator": {
            "image": {
                "repository": "registry.example.com/moelora/operator",
                "digest": "sha256:" + "ab" * 32,
                "pullPolicy": "Always",
            },
            "imagePullSecrets": [{"name": "regcred"}],
            "peering": {"enabled": True, "name": "moelora-peers"},
            "serviceAccount": {"create": False, "name": "existing-operator"},
            "env": [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}],
            "podAnnotations": {"example.com/audit": "on"},
            "podLabels": {"example.com/tier": "control"},
            "priorityClassName": "system-cluster-critical",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                    ]
                }
            },
        },
        "server": {
            "image": {"repository": "registry.example.com/moelora/server", "tag": "0.1.0-vllm0.26.0"},
            "agentImage": {"repository": "registry.example.com/moelora/agent"},
            "serviceAccount": {
                "name": "llm",
                "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/read-adapters"},
            },
            "namespaces": ["serving", "serving-canary"],
            "drainDelaySeconds": 0,
        },
    },
    "crds-not-kept": {"crds": {"keep": False}},
}


@functools.cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@functools.cache
def _render(name: str, release: str) -> tuple[tuple[str, str], ...]:
    manifests = chart().render(copy.deepcopy(VALUE_SETS[name]), name=release, namespace=NAMESPACE, is_install=True)
    return tuple(sorted(manifests.items()))


def render(name: str, *, release: str = "moelora") -> list[dict[str, Any]]:
    """The objects the chart renders for a value set (NOTES.txt left out)."""
    objects = []
    for path, text in _render(name, release):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def notes(name: str) -> str:
    return dict(_render(name, "moelora"))["moelora/templates/NOTES.txt"]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [obj for obj in of_kind(objects, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def chart_crds() -> dict[str, dict[str, Any]]:
    """Every CRD the chart can install (its templates with defaults, and Helm's crds/ folder), by kind."""
    crds = [obj for obj in render("defaults") if obj["kind"] == "CustomResourceDefinition"]
    for entry in chart().crds:
        crds.extend(doc for doc in yaml.safe_load_all(entry["data"]) if doc)
    return {crd["spec"]["names"]["kind"]: crd for crd in crds}


def operator_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {env["name"]: env.get("value", env.get("valueFrom")) for env in container["env"]}


# --- rendering, validation, lint ------------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_object_is_valid(value_set: str) -> None:
    objects = render(value_set)
    crds = chart_crds()
    kinds = set()
    for obj in objects:
        kinds.add(obj["kind"])
        group = obj["apiVersion"].rsplit("/", 1)[0] if "/" in obj["apiVersion"] else ""
        if obj["kind"] in crds and crds[obj["kind"]]["spec"]["group"] == group:
            schema = crds[obj["kind"]]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            jsonschema.validate(obj, schema)
            continue
        for version in KUBE_VERSIONS:
            # strict: an unknown or misspelt field fails, as the API server's strict field validation would.
            kubernetes_validate.validate(obj, version, strict=True)
    assert {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "RoleBinding" if value_set == "ha-namespaced" else "ClusterRoleBinding",
    } <= kinds


def test_crds_folder_objects_are_valid() -> None:
    """Helm's crds/ folder (kopf's peering CRDs) is installed as-is, outside templating: validate it too."""
    entries = chart().crds
    assert entries
    for entry in entries:
        for obj in (doc for doc in yaml.safe_load_all(entry["data"]) if doc):
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_lint_is_clean(value_set: str) -> None:
    report = helm.lint(CHART, copy.deepcopy(VALUE_SETS[value_set]), strict=True, namespace=NAMESPACE)
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_names_are_truncated_to_63_characters() -> None:
    for value_set, release in (("custom", "moelora"), ("defaults", LONG_RELEASE)):
        for obj in render(value_set, release=release):
            name = obj["metadata"]["name"]
            assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), name
            for value in obj["metadata"].get("labels", {}).values():
                assert len(value) <= 63, value
    # The prefix is cut, never the suffix: the operator's three ClusterRoles and the server's stay distinct.
    cluster_roles = [
        obj["metadata"]["name"] for obj in of_kind(render("defaults", release=LONG_RELEASE), "ClusterRole")
    ]
    assert sorted(name.rsplit("-", 1)[-1] for name in cluster_roles) == ["cluster", "operator", "secrets", "server"]
    assert len(set(cluster_roles)) == 4 and all(name.startswith(LONG_RELEASE[:40]) for name in cluster_roles)


# --- values schema --------------------------------------------------------------------------------------------


def test_schema_accepts_the_defaults_and_every_value_set() -> None:
    chart().validate_schema(None)
    chart().validate_schema(yaml.safe_load((CHART / "values.yaml").read_text()))
    for values in VALUE_SETS.values():
        chart().validate_schema(copy.deepcopy(values))


@pytest.mark.parametrize(
    "typo",
    [
        {"operator": {"replica": 2}},
        {"crds": {"enable": False}},
        {"watchNamespace": ["ml"]},
        {"server": {"image": {"repository": "x", "tags": "1"}}},
        {"operator": {"peering": {"enabled": True, "nmae": "x"}}},
        {"server": {"serviceAccount": {"name": "moelora-server", "annotation": {}}}},
    ],
)
def test_schema_rejects_typos(typo: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError, match="additional properties"):
        chart().render(typo, name="moelora", namespace=NAMESPACE)


@pytest.mark.parametrize(
    "bad",
    [
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"operator": {"replicas": -1}},
        {"operator": {"image": {"repository": "x", "pullPolicy": "Sometimes"}}},
        {"server": {"image": {"repository": "x", "digest": "sha256:short"}}},
        {"server": {"drainDelaySeconds": -1}},
        {"server": {"drainDelaySeconds": 61}},
    ],
)
def test_schema_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart().render(bad, name="moelora", namespace=NAMESPACE)


def _values_reference() -> Any:
    spec = importlib.util.spec_from_file_location(
        "values_reference", pathlib.Path(__file__).with_name("values_reference.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("values_reference", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_key_in_values_yaml_is_documented_with_an_example() -> None:
    """Each leaf of values.yaml has a `# --` description and an `Example:` of itself (entries() raises if not)."""
    reference = _values_reference()
    documented = {entry.key for entry in reference.entries((CHART / "values.yaml").read_text())}

    def leaves(values: dict[str, Any], prefix: str = "") -> set[str]:
        found = set()
        for key, value in values.items():
            if isinstance(value, dict) and value and key not in reference.WHOLE:
                found |= leaves(value, prefix + key + ".")
            else:
                found.add(prefix + key)
        return found

    assert documented == leaves(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert len(documented) > 30


def test_chart_reference_doc_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).with_name("values_reference.py")), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_schema_covers_exactly_the_keys_of_values_yaml() -> None:
    def keys(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
        missing = []
        for key, value in values.items():
            properties = schema.get("properties", {})
            if key not in properties:
                missing.append(prefix + key)
            elif isinstance(value, dict) and properties[key].get("additionalProperties") is False:
                missing.extend(keys(value, properties[key], prefix + key + "."))
        return missing

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert keys(values, schema) == []
    assert set(schema["properties"]) - {"global"} == set(values)


# --- CRDs -----------------------------------------------------------------------------------------------------


def test_chart_crd_files_are_byte_identical_to_the_generated_ones() -> None:
    generated = rendered_files()
    for folder in (ROOT / "crds", CHART / "files" / "crds"):
        on_disk = {path.name: path.read_bytes() for path in folder.glob("*.yaml")}
        assert on_disk == {name: text.encode() for name, text in generated.items()}, folder


def test_rendered_crds_are_the_generated_ones_plus_labels_and_keep() -> None:
    generated = {yaml.safe_load(text)["metadata"]["name"]: yaml.safe_load(text) for text in rendered_files().values()}
    rendered = {crd["metadata"]["name"]: crd for crd in of_kind(render("defaults"), "CustomResourceDefinition")}
    assert set(rendered) == set(generated) == {"modelservers.moelora.io", "loraadapters.moelora.io"}
    for name, crd in rendered.items():
        metadata = crd.pop("metadata")
        expected = generated[name]
        assert metadata["name"] == expected.pop("metadata")["name"]
        assert crd == expected
        assert metadata["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    not_kept = of_kind(render("crds-not-kept"), "CustomResourceDefinition")
    assert len(not_kept) == 2 and all("annotations" not in crd["metadata"] for crd in not_kept)
    assert of_kind(render("custom"), "CustomResourceDefinition") == []
    assert "apply crds/*.yaml" in dict(_render("custom", "moelora"))["moelora/templates/NOTES.txt"]


def test_kopf_peering_crds_match_what_kopf_talks_to() -> None:
    from kopf._cogs.structs import references

    crds = chart_crds()
    for selector, kind, scope in (
        (references.CLUSTER_PEERINGS_K, "ClusterKopfPeering", "Cluster"),
        (references.NAMESPACED_PEERINGS_K, "KopfPeering", "Namespaced"),
    ):
        spec = crds[kind]["spec"]
        assert (spec["group"], spec["names"]["plural"], spec["scope"]) == (selector.group, selector.any_name, scope)
        assert [v["name"] for v in spec["versions"]] == [selector.version]
        # kopf merge-patches peers' keep-alives into `status` of the main object: it must be kept, not pruned.
        status = spec["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


# --- the operator Deployment ----------------------------------------------------------------------------------


def test_operator_settings_follow_the_architecture_contract() -> None:
    env = operator_env(render("defaults"))
    assert env["MOELORA_SERVER_IMAGE"] == "ghcr.io/moelora/moelora-server:0.1.0-vllm0.26.0"
    assert env["MOELORA_AGENT_IMAGE"] == env["MOELORA_SERVER_IMAGE"]
    assert env["MOELORA_SERVER_SERVICE_ACCOUNT"] == "moelora-server"
    # Unset settings are left out: the API server would store `value: ""` as no value at all.
    for value_set in VALUE_SETS:
        assert not [name for name, value in operator_env(render(value_set)).items() if value == ""], value_set
    assert not {"MOELORA_NAMESPACES", "MOELORA_PEERING", "MOELORA_ALLOWED_SERVICE_ACCOUNTS"} & env.keys()
    from_chart = Settings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert from_chart.namespaces == () and from_chart.drain_delay_seconds == Settings().drain_delay_seconds
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # The liveness probe asks the endpoint the operator is told to serve (parsed the operator's own way).
    container = one(render("defaults"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    endpoint = Settings.from_env({"MOELORA_LIVENESS_ENDPOINT": env["MOELORA_LIVENESS_ENDPOINT"]}).liveness_endpoint
    parts = urllib.parse.urlsplit(endpoint)
    probe = container["livenessProbe"]["httpGet"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (probe["path"], ports[probe["port"]]) == (parts.path, parts.port)

    env = operator_env(render("custom"))
    assert env["MOELORA_AGENT_IMAGE"] == "registry.example.com/moelora/agent:0.1.0-vllm0.26.0"
    assert env["MOELORA_SERVER_SERVICE_ACCOUNT"] == "llm"
    assert env["HTTPS_PROXY"] == "http://proxy.example.com:3128"
    assert (
        Settings.from_env({"MOELORA_DRAIN_DELAY_SECONDS": env["MOELORA_DRAIN_DELAY_SECONDS"]}).drain_delay_seconds == 0
    )
    # The schema refuses at install what the operator would refuse at start.
    delay = json.loads((CHART / "values.schema.json").read_text())["properties"]["server"]["properties"]
    assert delay["drainDelaySeconds"]["maximum"] == MAX_DRAIN_DELAY_SECONDS
    assert operator_env(render("ha-namespaced"))["MOELORA_NAMESPACES"] == "ml-a,ml-b"


def test_operator_runs_non_root_with_a_read_only_root() -> None:
    for value_set in VALUE_SETS:
        pod = one(render(value_set), "Deployment")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["command"] == ["python3", "-m", "moelora.operator"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    custom = one(render("custom"), "Deployment")["spec"]["template"]["spec"]
    assert custom["containers"][0]["image"] == "registry.example.com/moelora/operator@sha256:" + "ab" * 32
    assert custom["serviceAccountName"] == "existing-operator"
    assert not [
        sa for sa in of_kind(render("custom"), "ServiceAccount") if sa["metadata"]["name"] == "existing-operator"
    ]


def test_one_replica_is_standalone_and_never_overlaps() -> None:
    objects = render("defaults")
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not of_kind(objects, "ClusterKopfPeering") and not of_kind(objects, "KopfPeering")


def test_several_replicas_turn_peering_on() -> None:
    objects = render("ha-clusterwide")
    assert one(objects, "Deployment")["spec"]["replicas"] == 2
    assert "strategy" not in one(objects, "Deployment")["spec"]  # rolling: the standby takes over
    peering = one(objects, "ClusterKopfPeering")
    assert operator_env(objects)["MOELORA_PEERING"] == peering["metadata"]["name"] == "moelora"

    objects = render("ha-namespaced")
    peerings = of_kind(objects, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["ml-a", "ml-b"]
    assert {p["metadata"]["name"] for p in peerings} == {operator_env(objects)["MOELORA_PEERING"]}
    assert not of_kind(objects, "ClusterKopfPeering")

    objects = render("custom")  # one replica, peering asked for by value
    assert operator_env(objects)["MOELORA_PEERING"] == one(objects, "ClusterKopfPeering")["metadata"]["name"]


# --- RBAC -----------------------------------------------------------------------------------------------------

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)

OPERATOR_NAMESPACED: set[Rule] = {
    *{("moelora.io", "modelservers", v) for v in ("get", "list", "watch", "patch")},
    *{("moelora.io", "loraadapters", v) for v in ("list", "watch")},
    *{("moelora.io", r, "patch") for r in ("modelservers/status", "loraadapters/status")},
    *{
        ("apps", r, v)
        for r in ("deployments", "statefulsets")
        for v in ("get", "list", "watch", "create", "patch", "delete")
    },
    *{
        (group, resource, v)
        for group, resource in (
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
            ("inference.networking.k8s.io", "inferencepools"),
            ("gateway.networking.k8s.io", "httproutes"),
            ("autoscaling", "horizontalpodautoscalers"),
            ("keda.sh", "scaledobjects"),
        )
        for v in ("get", "create", "patch", "delete")
    },
    *{("", r, v) for r in ("services", "configmaps") for v in ("get", "create", "patch")},
    ("", "configmaps", "delete"),
    ("", "services", "delete"),  # the headless Service of spec.placement, once placement is off
    # routeToHome's per-pod Services and their routes, found by label to delete those no longer rendered
    ("", "services", "list"),
    ("gateway.networking.k8s.io", "httproutes", "list"),
    ("", "configmaps", "list"),  # the adapters' router ConfigMaps of a routed server
    *{("policy", "poddisruptionbudgets", v) for v in ("get", "create", "patch", "delete")},
    *{
        ("rbac.authorization.k8s.io", r, v)
        for r in ("roles", "rolebindings")
        for v in ("get", "create", "patch", "delete")
    },
    ("moelora.io", "modelservers/finalizers", "update"),
    *{
        (g, r, v)
        for g, r in (("", "persistentvolumeclaims"), ("batch", "jobs"))
        for v in ("get", "list", "watch", "create", "delete")
    },
    *{("", "pods", v) for v in ("get", "list", "watch")},
    ("", "events", "create"),
    ("", "events", "patch"),  # an identical LoRAAdapter Event is counted on the stored one
}
KOPF_SCAN: set[Rule] = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
CLUSTER_PEERING: set[Rule] = {("kopf.dev", "clusterkopfpeerings", v) for v in ("list", "watch", "patch")}
NAMESPACED_PEERING: set[Rule] = {("kopf.dev", "kopfpeerings", v) for v in ("list", "watch", "patch")}
SECRETS: set[Rule] = {("", "secrets", "get")}
# No Secrets: each server's pods get exactly its adapters' Secrets from a Role the operator owns.
AGENT: set[Rule] = {
    *{("moelora.io", "loraadapters", v) for v in ("list", "watch")},
    ("moelora.io", "loraadapters/status", "patch"),
    ("", "events", "create"),  # ForeignAdapterUnloaded / ForeignAdapterReplaced on its own Pod
}


def grants(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str | None], set[Rule]]:
    """What each ServiceAccount may do where: {(sa namespace, sa name, namespace or None = cluster-wide): rules}."""
    roles = {(role["kind"], role["metadata"]["name"]): role for role in of_kind(objects, "ClusterRole")}
    result: dict[tuple[str, str, str | None], set[Rule]] = {}
    for binding in of_kind(objects, "ClusterRoleBinding") + of_kind(objects, "RoleBinding"):
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        rules = {
            (group, resource, verb)
            for rule in role["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }
        assert all("resourceNames" not in rule for rule in role["rules"])
        where = binding["metadata"].get("namespace")
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            key = (subject["namespace"], subject["name"], where)
            result[key] = result.get(key, set()) | rules
    return result


def test_rbac_default_is_cluster_wide_for_the_operator_and_namespaced_for_the_agent() -> None:
    assert grants(render("defaults")) == {
        (NAMESPACE, "moelora-operator", None): OPERATOR_NAMESPACED | KOPF_SCAN,
        (NAMESPACE, "moelora-operator", NAMESPACE): SECRETS,  # the server namespace: to grant its adapters' Secrets
        (NAMESPACE, "moelora-server", NAMESPACE): AGENT,
    }


def test_rbac_with_watched_namespaces_and_peering() -> None:
    # Named namespaces: kopf's scanning is off, so nothing cluster-scoped is granted.
    assert grants(render("ha-namespaced")) == {
        (NAMESPACE, "moelora-operator", "ml-a"): OPERATOR_NAMESPACED | NAMESPACED_PEERING | SECRETS,
        (NAMESPACE, "moelora-operator", "ml-b"): OPERATOR_NAMESPACED | NAMESPACED_PEERING | SECRETS,
        ("ml-a", "moelora-server", "ml-a"): AGENT,
        ("ml-b", "moelora-server", "ml-b"): AGENT,
    }


def test_rbac_with_cluster_wide_peering() -> None:
    assert grants(render("ha-clusterwide")) == {
        (NAMESPACE, "moelora-operator", None): OPERATOR_NAMESPACED | KOPF_SCAN | CLUSTER_PEERING,
        (NAMESPACE, "moelora-operator", NAMESPACE): SECRETS,
        (NAMESPACE, "moelora-server", NAMESPACE): AGENT,
    }


def test_rbac_custom_accounts_and_server_namespaces() -> None:
    assert grants(render("custom")) == {
        (NAMESPACE, "existing-operator", None): OPERATOR_NAMESPACED | KOPF_SCAN | CLUSTER_PEERING,
        (NAMESPACE, "existing-operator", "serving"): SECRETS,
        (NAMESPACE, "existing-operator", "serving-canary"): SECRETS,
        ("serving", "llm", "serving"): AGENT,
        ("serving-canary", "llm", "serving-canary"): AGENT,
    }
    accounts = {
        (sa["metadata"]["namespace"], sa["metadata"]["name"]): sa for sa in of_kind(render("custom"), "ServiceAccount")
    }
    assert set(accounts) == {("serving", "llm"), ("serving-canary", "llm")}
    assert accounts[("serving", "llm")]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(
        "read-adapters"
    )


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_no_secret_access_cluster_wide(value_set: str) -> None:
    for (_, _, where), rules in grants(render(value_set)).items():
        if where is None:
            assert not {rule for rule in rules if rule[1] == "secrets"}, value_set


def test_cluster_wide_secret_access_only_when_asked_for() -> None:
    def granted(values: dict[str, Any]) -> dict[tuple[str, str, str | None], set[Rule]]:
        manifests = chart().render(values, name="moelora", namespace=NAMESPACE)
        return grants(
            [
                doc
                for path, text in manifests.items()
                if not path.endswith("NOTES.txt")
                for doc in yaml.safe_load_all(text)
                if doc
            ]
        )

    everywhere = granted({"operator": {"secretAccess": "clusterWide"}})
    assert everywhere[(NAMESPACE, "moelora-operator", None)] == OPERATOR_NAMESPACED | KOPF_SCAN | SECRETS
    never = granted({"operator": {"secretAccess": "none"}, "watchNamespaces": ["ml"]})
    assert never[(NAMESPACE, "moelora-operator", "ml")] == OPERATOR_NAMESPACED


def test_notes_give_the_next_commands() -> None:
    text = notes("defaults")
    assert "kubectl -n moelora-system rollout status deployment/moelora-operator" in text
    assert "kubectl apply" in text and "port-forward" in text and "/v1/completions" in text
    assert "kopf peering" in notes("ha-clusterwide")


def test_rbac_covers_every_resource_the_operators_kopf_registry_watches() -> None:
    """Tie the chart to the operator's code: each resource a kopf handler selects needs list+watch, and each one
    with changing handlers or timers needs patch too (kopf writes finalizers and progress annotations there)."""
    from moelora.operator.control.wiring import make_registry
    from moelora.operator.settings import Settings

    registry = make_registry(Settings())
    needed: set[Rule] = set()
    for handlers, verbs in (
        (registry._indexing, ("list", "watch")),
        (registry._watching, ("list", "watch")),
        (registry._changing, ("list", "watch", "patch")),
        (registry._spawning, ("list", "watch", "patch")),
    ):
        for handler in handlers.get_all_handlers():
            selector = handler.selector
            assert selector is not None and selector.any_name, handler
            needed |= {(selector.group or "", selector.any_name, verb) for verb in verbs}
    assert needed, "the registry has handlers"
    assert needed - OPERATOR_NAMESPACED == set()


def test_rbac_covers_every_write_the_operator_makes() -> None:
    """Tie the chart to apply.py: get/create/patch on every kind the operator renders (get/create/delete on those it
    never patches), delete on the kinds it removes when a ModelServer stops asking for them (a 403 there would fail
    every reconcile of that server)."""
    from moelora.operator.kube import apply
    from moelora.operator.render.children import OPTIONAL_CHILDREN

    def group_and_plural(api_version: str, kind: str) -> tuple[str, str]:
        path = apply._PATHS[(api_version, kind)]
        parts = path.strip("/").split("/")
        return ("" if parts[0] == "api" else parts[1]), parts[-1]

    needed: set[Rule] = set()
    for api_version, kind in apply._PATHS:
        group, plural = group_and_plural(api_version, kind)
        # The model cache's claim and Job: created once, never patched, deleted when stale (cache_sync.prune).
        verbs = ("get", "create", "delete") if (api_version, kind) in apply._CREATE_ONLY else ("get", "create", "patch")
        needed |= {(group, plural, verb) for verb in verbs}
    for api_version, kind in OPTIONAL_CHILDREN:
        needed.add((*group_and_plural(api_version, kind), "delete"))
    assert ("policy", "poddisruptionbudgets", "delete") in needed
    for value_set in VALUE_SETS:
        operator_rules = set().union(
            *(rules for (_, account, _), rules in grants(render(value_set)).items() if account.endswith("operator"))
        )
        assert needed - operator_rules == set(), value_set
