"""The chart's optional monitoring: a PodMonitor or ServiceMonitor of the server pods, and a Grafana dashboard.

The server pods and Services are the operator's, not the chart's, so the monitors are checked against what the
operator's own builders render: their selector must match those labels and every scraped port name must exist there.
The operator's own monitor is checked against the chart's operator Deployment (and, for a ServiceMonitor, the
Service the chart adds for it). The monitors themselves are admitted against the Prometheus Operator's published CRDs
(vendored in moelora.local.apiserver, loaded as published: schema, CEL rules, and no field the server would prune),
and the dashboard's queries may name only metrics that exist: the agent's and the
operator's, from their registries, and vLLM's (VLLM_METRICS).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import pathlib
import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from moelora.agent.report.metrics import Metrics
from moelora.api import ModelServerSpec
from moelora.local.apiserver import upstream
from moelora.operator.control.metrics import Metrics as OperatorMetrics
from moelora.operator.render import deployment, naming, service
from moelora.operator.render.children import Surroundings, desired_children
from moelora.operator.settings import Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "moelora"
NAMESPACE = "moelora-system"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "pod-monitor": {
        "watchNamespaces": ["serving", "staging"],
        "monitoring": {
            "podMonitor": {"enabled": True, "labels": {"release": "kps"}, "interval": "30s", "scrapeTimeout": "10s"},
            "dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "LLM"}},
        },
    },
    "service-monitor": {"monitoring": {"serviceMonitor": {"enabled": True}, "dashboard": {"enabled": True}}},
}

# vLLM's metrics the dashboard reads, with their types: the V1 engine's PrometheusStatLogger
# (vllm/v1/metrics/loggers.py) defines them; test_vllm_metric_names_are_defined_by_vllm checks the installed vLLM.
# Counters and histograms are exposed with prometheus_client's suffixes (_total; _bucket, _sum, _count).
VLLM_METRICS = {
    "vllm:lora_requests_info": "gauge",  # labels running_lora_adapters, waiting_lora_adapters, max_lora
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",  # label finished_reason
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}
SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


@functools.cache
def _render(name: str) -> tuple[tuple[str, str], ...]:
    chart = helm.Chart.load(CHART)
    manifests = chart.render(copy.deepcopy(VALUE_SETS[name]), name="moelora", namespace=NAMESPACE, is_install=True)
    return tuple(sorted(manifests.items()))


def render(name: str) -> list[dict[str, Any]]:
    return [
        doc for path, text in _render(name) if not path.endswith("NOTES.txt") for doc in yaml.safe_load_all(text) if doc
    ]


def one(objects: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    """The one object of `kind` (whose name ends in `suffix`, where several are)."""
    found = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server_objects() -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod template and the Service the operator renders for a ModelServer."""
    spec = ModelServerSpec.model_validate({"model": {"name": "org/tiny-moe"}})
    settings = Settings(server_image="example.com/server:1", agent_image="example.com/agent:1")
    pod = deployment.deployment(spec, name="srv", namespace="serving", settings=settings)["spec"]["template"]
    return pod, service.service(name="srv", namespace="serving")


def meta_label(role: str, key: str) -> str:
    """Prometheus' Kubernetes discovery label of an object label: non-alphanumerics become underscores."""
    return f"__meta_kubernetes_{role}_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


# --- the monitors ---------------------------------------------------------------------------------------------


def test_off_by_default() -> None:
    manifests = helm.Chart.load(CHART).render({}, name="moelora", namespace=NAMESPACE)
    assert not manifests.get("moelora/templates/monitoring.yaml", "").strip()
    assert not manifests.get("moelora/templates/dashboard.yaml", "").strip()


@pytest.mark.parametrize(("value_set", "kind"), [("pod-monitor", "PodMonitor"), ("service-monitor", "ServiceMonitor")])
def test_monitor_follows_the_prometheus_operator_crd(value_set: str, kind: str) -> None:
    objects = render(value_set)
    for suffix in ("-servers", "-operator"):
        monitor = one(objects, kind, suffix)
        admission = upstream.admission(monitor)
        assert (admission.errors, admission.pruned) == ([], []), admission.message or admission.pruned
        endpoints = monitor["spec"]["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
        assert endpoints and all(endpoint.get("port") for endpoint in endpoints)  # a port name says what to scrape
        assert monitor["metadata"]["namespace"] == NAMESPACE
    assert not [obj for obj in objects if obj["kind"] in {"PodMonitor", "ServiceMonitor"} - {kind}]


def test_the_published_crd_refuses_a_bad_duration_and_drops_a_misspelt_field() -> None:
    monitor = copy.deepcopy(one(render("pod-monitor"), "PodMonitor", "-servers"))
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "30 s"
    monitor["spec"]["podMetricsEndpoints"][0]["scrapeTimeOut"] = "10s"
    admission = upstream.admission(monitor)
    assert [str(error) for error in admission.errors] == [
        'spec.podMetricsEndpoints[0].interval: Invalid value: "30 s": spec.podMetricsEndpoints[0].interval in body '
        "should match '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'"
    ]
    assert admission.pruned == ["spec.podMetricsEndpoints[0].scrapeTimeOut"]


def test_pod_monitor_scrapes_the_agent_and_vllm_ports_of_the_operators_pods() -> None:
    monitor = one(render("pod-monitor"), "PodMonitor", "-servers")
    pod, _ = server_objects()
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    ports = {
        port["name"]: (container["name"], port["containerPort"])
        for container in pod["spec"]["containers"]
        for port in container.get("ports", [])
    }
    scraped = {endpoint["port"]: ports.get(endpoint["port"]) for endpoint in monitor["spec"]["podMetricsEndpoints"]}
    assert scraped == {"http": ("vllm", 8000), "agent": ("agent", service.AGENT_PORT)}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "30s", "10s")
        relabel = endpoint["relabelings"][0]
        assert relabel == {"sourceLabels": [meta_label("pod", naming.LABEL_SERVER)], "targetLabel": "model_server"}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["serving", "staging"]}
    assert monitor["metadata"]["labels"]["release"] == "kps"


def test_service_monitor_scrapes_the_ports_of_the_operators_service() -> None:
    monitor = one(render("service-monitor"), "ServiceMonitor", "-servers")
    pod, svc = server_objects()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    container_ports = {port["name"] for c in pod["spec"]["containers"] for port in c.get("ports", [])}
    service_ports = {port["name"]: port for port in svc["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports
        assert service_ports[endpoint["port"]]["targetPort"] in container_ports
        assert endpoint["relabelings"][0]["sourceLabels"] == [meta_label("service", naming.LABEL_SERVER)]
        assert "interval" not in endpoint  # empty value: Prometheus' own
    assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} == {"http", "agent-metrics"}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}  # all namespaces are watched


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def served_pods_and_services(spec: dict[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The labels of a server's pods that serve vLLM's port, and every Service in front of them: the operator's,
    plus, for a LeaderWorkerSet, the headless one its controller creates (named after it, labelled and selecting
    leaderworkerset.sigs.k8s.io/name, kubernetes-sigs/lws pkg/utils/controller/controller_utils.go); the LWS
    controller labels each group's leader worker-index "0" and its set's name."""
    settings = Settings(server_image="example.com/server:1", agent_image="example.com/agent:1")
    children = desired_children(
        ModelServerSpec.model_validate({"model": {"name": "org/tiny-moe"}, **spec}),
        name="srv",
        namespace="serving",
        settings=settings,
        kernel_bundle=None,
        surroundings=Surroundings(),
    )
    services = [child for child in children if child["kind"] == "Service"]
    [workload] = [child for child in children if child["kind"] in {"Deployment", "StatefulSet", "LeaderWorkerSet"}]
    if workload["kind"] != "LeaderWorkerSet":
        return [workload["spec"]["template"]["metadata"]["labels"]], services
    lws = workload["metadata"]["name"]
    set_label = {"leaderworkerset.sigs.k8s.io/name": lws}
    services.append(
        {"metadata": {"name": lws, "labels": set_label}, "spec": {"clusterIP": "None", "selector": set_label}}
    )
    leader = workload["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    return [{**leader, **set_label, "leaderworkerset.sigs.k8s.io/worker-index": "0"}], services


@pytest.mark.parametrize(
    "spec", [{}, {"placement": {"copies": 1}, "replicas": 2}, {"nodes": 2}], ids=["deployment", "placement", "nodes"]
)
def test_service_monitor_scrapes_each_serving_pod_through_one_service(spec: dict[str, Any]) -> None:
    """Prometheus scrapes a pod once per Service the ServiceMonitor selects in front of it (one target per
    endpoint), so a second Service of the same pods (placement's headless <server>-pods) doubles every series of
    them, and every sum KEDA takes of the queue."""
    template = dict(_render("service-monitor"))["moelora/templates/monitoring.yaml"]  # not the chart's CRDs too
    monitor = one([doc for doc in yaml.safe_load_all(template) if doc], "ServiceMonitor", "-servers")
    assert "matchExpressions" not in monitor["spec"]["selector"]
    chosen = monitor["spec"]["selector"]["matchLabels"]
    pods, services = served_pods_and_services(spec)
    for pod in pods:
        scraped = [
            svc["metadata"]["name"]
            for svc in services
            if selects(svc["spec"]["selector"], pod) and selects(chosen, svc["metadata"]["labels"])
        ]
        assert scraped == ["srv"]


def operator_metrics_port(objects: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any]]:
    """The chart's operator pod labels, and its container port named `metrics`."""
    template = one(objects, "Deployment")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    ports = [port for port in container["ports"] if port["name"] == "metrics"]
    env = {var["name"]: var.get("value") for var in container["env"]}
    assert len(ports) == 1 and env["MOELORA_METRICS_PORT"] == str(ports[0]["containerPort"])
    return template["metadata"]["labels"], ports[0]


def test_pod_monitor_scrapes_the_operators_metrics_port() -> None:
    objects = render("pod-monitor")
    monitor = one(objects, "PodMonitor", "-operator")
    labels, _ = operator_metrics_port(objects)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "30s")
    assert monitor["metadata"]["labels"]["release"] == "kps"


def test_service_monitor_scrapes_the_operators_metrics_service() -> None:
    objects = render("service-monitor")
    monitor = one(objects, "ServiceMonitor", "-operator")
    svc = one(objects, "Service", "-operator-metrics")
    labels, port = operator_metrics_port(objects)
    kubernetes_validate.validate(svc, "1.33.0", strict=True)
    assert svc["spec"]["selector"].items() <= labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (service_port,) = svc["spec"]["ports"]
    assert (service_port["name"], service_port["targetPort"], service_port["port"]) == (
        "metrics",
        "metrics",
        port["containerPort"],
    )
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("metrics", "/metrics")]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_both_monitors_at_once_are_refused() -> None:
    values = {"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}}
    with pytest.raises(helm.HelmRenderError, match="not both"):
        helm.Chart.load(CHART).render(values, name="moelora", namespace=NAMESPACE)


@pytest.mark.parametrize("bad", [{"interval": "30 seconds"}, {"scrapeTimeout": "10"}, {"enable": True}])
def test_schema_rejects_bad_monitor_values(bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).render({"monitoring": {"podMonitor": bad}}, name="moelora", namespace=NAMESPACE)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_lint_is_clean(value_set: str) -> None:
    report = helm.lint(CHART, copy.deepcopy(VALUE_SETS[value_set]), strict=True, namespace=NAMESPACE)
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


# --- the dashboard --------------------------------------------------------------------------------------------


def dashboard(value_set: str) -> tuple[dict[str, Any], dict[str, Any]]:
    config_map = one(render(value_set), "ConfigMap")
    return config_map, json.loads(config_map["data"]["moelora.json"])


def exprs(board: dict[str, Any]) -> list[str]:
    found = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    return found + [variable["definition"] for variable in board["templating"]["list"] if variable["type"] == "query"]


def families() -> list[Any]:
    """The metric families of the agent's and the operator's registries."""
    return [*Metrics().registry.collect(), *OperatorMetrics().registry.collect()]


def our_metric_names() -> set[str]:
    """The names the agent's and the operator's registries expose, with the suffixes of each type."""
    return {family.name + suffix for family in families() for suffix in SUFFIXES[family.type]}


def test_dashboard_configmap_is_for_grafanas_sidecar() -> None:
    for value_set, namespace in (("pod-monitor", "monitoring"), ("service-monitor", NAMESPACE)):
        config_map, board = dashboard(value_set)
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == namespace
        for version in ("1.31.0", "1.37.0"):
            kubernetes_validate.validate(config_map, version, strict=True)
        assert board == json.loads((CHART / "files" / "dashboards" / "moelora.json").read_text())
    assert one(render("pod-monitor"), "ConfigMap")["metadata"]["annotations"] == {"grafana_folder": "LLM"}


def test_dashboard_panels_are_well_formed() -> None:
    _, board = dashboard("pod-monitor")
    assert board["uid"] and board["title"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in board["templating"]["list"]}
    assert variables == {"datasource", "namespace", "model_server"}
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["title"] and panel["description"]
        for target in panel["targets"]:
            if "moelora_operator_" in target["expr"]:
                # The operator's series are about no one server (and carry the operator's namespace).
                assert "$namespace" not in target["expr"] and "model_server=" not in target["expr"], panel["title"]
            else:
                # model_server exists only through the monitors' relabelings: every query filters on it.
                assert 'namespace=~"$namespace", model_server=~"$model_server"' in target["expr"], panel["title"]
            expr = re.sub(r'"[^"]*"', "", target["expr"])  # label values may hold any character
            assert (expr.count("("), expr.count("{"), expr.count("[")) == (
                expr.count(")"),
                expr.count("}"),
                expr.count("]"),
            ), target["expr"]


def test_dashboard_queries_name_only_metrics_that_exist() -> None:
    _, board = dashboard("pod-monitor")
    known = our_metric_names() | {name + suffix for name, kind in VLLM_METRICS.items() for suffix in SUFFIXES[kind]}
    used = set()
    for expr in exprs(board):
        names = set(re.findall(r"(?<![\w:])(moelora_\w+|vllm:[\w:]+)", expr))
        assert names, f"names no metric: {expr}"
        used |= names
    assert used - known == set()
    # Every metric of the agent and of the operator appears on the dashboard.
    assert {name.removesuffix("_total").removesuffix("_bucket") for name in used} >= {
        family.name for family in families() if family.type != "histogram" or family.name.startswith("moelora_operator")
    }


def test_vllm_metric_names_are_defined_by_vllm() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = (pathlib.Path(spec.submodule_search_locations[0]) / "v1" / "metrics" / "loggers.py").read_text()
    for name, kind in VLLM_METRICS.items():
        assert re.search(rf'_{kind}_cls\(\s*name="{re.escape(name)}"', source), name
