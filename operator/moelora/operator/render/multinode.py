"""A ModelServer whose replica spans several nodes: a LeaderWorkerSet instead of a Deployment.

Each replica is a group of `nodes` pods, each holding `gpus` GPUs, run the way vLLM documents multi-node serving:
a Ray head on the leader, the workers joining it at the address LeaderWorkerSet gives them, and the OpenAI server on
the leader alone with --tensor-parallel-size = gpus and --pipeline-parallel-size = nodes. Adapters are loaded
through the leader's API (vLLM's engine spreads them over the group), so the agent runs beside the leader only, and
the Service and the InferencePool select leaders only.

The LeaderWorkerSet controller creates a headless Service named after the LeaderWorkerSet when none exists, and gives
every pod that subdomain: LWS_LEADER_ADDRESS is `<lws>-<group>.<lws>.<namespace>` (kubernetes-sigs/lws,
pkg/controllers/leaderworkerset_controller.go reconcileHeadlessServices, pkg/utils/pod/pod_utils.go). So the
LeaderWorkerSet is `<ms>-lws`, leaving that Service to its controller, and the server's own Service keeps `<ms>`.
"""

from __future__ import annotations

import copy
from typing import Any

from moelora.api import ModelServerSpec
from moelora.operator.errors import SpecProblem
from moelora.operator.render import engine, naming
from moelora.operator.render.deployment import AGENT_CONTAINER, KUBE_API_VOLUME, VLLM_CONTAINER

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_SUFFIX = "-lws"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" on each group's leader
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"  # set by LeaderWorkerSet in every pod of a group
RAY_PORT = 6379
# The StatefulSet controller labels each pod controller-revision-hash=<statefulset>-<hash of up to 10 characters>,
# and a label value holds at most 63: a longer StatefulSet name creates no pods. LeaderWorkerSet names its leaders'
# StatefulSet <lws> and each group's workers' <lws>-<group> (kubernetes-sigs/lws, leaderworkerset_types.go).
MAX_STATEFULSET_NAME = 52

# $@: vLLM's arguments, passed through untouched. Ray's node list counts the leader and every joined worker; vLLM
# would fail to place its pipeline stages if it started before all of them arrived.
_LEADER_SCRIPT = """\
ray start --head --port={port} --disable-usage-stats || exit 1
python3 -c '
import time, ray
ray.init(address="auto")
while sum(1 for node in ray.nodes() if node["Alive"]) < {nodes}:
    time.sleep(5)
' || exit 1
exec python3 -m vllm.entrypoints.openai.api_server "$@"
"""
# Set here from spec.nodes: the user's own would contradict the group's shape.
GROUP_FLAGS = frozenset({"--pipeline-parallel-size", "-pp", "--distributed-executor-backend"})
_WORKER_SCRIPT = 'exec ray start --address="${addr}:{port}" --block --disable-usage-stats'


def is_multi_node(spec: ModelServerSpec) -> bool:
    return spec.nodes > 1


def lws_name(name: str) -> str:
    return f"{name}{LWS_SUFFIX}"


def check(spec: ModelServerSpec, *, name: str) -> None:
    """Raises SpecProblem for what a multi-node server cannot be: placed (placement assigns adapters to a
    StatefulSet's pods by name; a group's adapters live on its leader, which no placement names), or named so long
    that its groups' StatefulSets could not create pods."""
    if not is_multi_node(spec):
        return
    if spec.placement is not None:
        raise SpecProblem(
            "PlacementMultiNode",
            f"spec.placement needs nodes 1: with nodes {spec.nodes} each replica is a LeaderWorkerSet group, which "
            "placement cannot assign adapters to; drop placement (every group then serves every adapter) or nodes",
        )
    replicas = max(spec.replicas, spec.autoscaling.max_replicas if spec.autoscaling is not None else 0)
    workers = f"{lws_name(name)}-{max(replicas - 1, 0)}"
    if len(workers) > MAX_STATEFULSET_NAME:
        raise SpecProblem(
            "NameTooLongForNodes",
            f"with nodes > 1 the LeaderWorkerSet names a StatefulSet {workers!r} ({len(workers)} characters), over "
            f"the {MAX_STATEFULSET_NAME} a StatefulSet may have and still create pods: shorten the ModelServer's name",
        )


def leader_selector(name: str) -> dict[str, str]:
    return {**naming.selector(name), WORKER_INDEX_LABEL: "0"}


def serving_selector(spec: ModelServerSpec, *, name: str) -> dict[str, str]:
    """The pods that answer requests: every pod, or each group's leader."""
    return leader_selector(name) if is_multi_node(spec) else naming.selector(name)


def _container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(container for container in pod_spec["containers"] if container["name"] == name)


def _leader_template(template: dict[str, Any], *, nodes: int) -> dict[str, Any]:
    leader = copy.deepcopy(template)
    vllm = _container(leader["spec"], VLLM_CONTAINER)
    script = _LEADER_SCRIPT.format(port=RAY_PORT, nodes=nodes)
    vllm["command"] = ["/bin/sh", "-c", script, "vllm-leader"]
    vllm["args"] = [
        *vllm["args"],
        "--distributed-executor-backend",
        "ray",
        "--pipeline-parallel-size",
        str(nodes),
    ]
    vllm["ports"] = [*vllm["ports"], {"name": "ray", "containerPort": RAY_PORT, "protocol": "TCP"}]
    return leader


def _worker_template(template: dict[str, Any]) -> dict[str, Any]:
    """The leader's pod without the agent (and its API token) and without the OpenAI server: a Ray worker with the
    same image, GPUs, model volume and environment."""
    worker = copy.deepcopy(template)
    pod_spec = worker["spec"]
    pod_spec["containers"] = [c for c in pod_spec["containers"] if c["name"] != AGENT_CONTAINER]
    pod_spec["volumes"] = [v for v in pod_spec["volumes"] if v["name"] != KUBE_API_VOLUME]
    vllm = _container(pod_spec, VLLM_CONTAINER)
    vllm["command"] = ["/bin/sh", "-c", _WORKER_SCRIPT.format(addr=LEADER_ADDRESS_ENV, port=RAY_PORT)]
    vllm.pop("args", None)
    vllm["ports"] = [{"name": "ray", "containerPort": RAY_PORT, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        vllm.pop(probe, None)  # no HTTP server here; a lost worker fails the leader's engine, whose probes tell
    return worker


def leader_worker_set(spec: ModelServerSpec, deployment: dict[str, Any]) -> dict[str, Any]:
    """The LeaderWorkerSet serving what `deployment` (the single-node rendering of the same spec) would. Raises
    SpecProblem for engineArgs that set the group's parallelism."""
    for token in spec.engine_args:
        if token.startswith("-") and engine.flag_name(token) in GROUP_FLAGS:
            raise SpecProblem(
                "ManagedEngineFlag", f"engineArgs may not set {engine.flag_name(token)}: moelora sets it from nodes"
            )
    template = deployment["spec"]["template"]
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {**copy.deepcopy(deployment["metadata"]), "name": lws_name(deployment["metadata"]["name"])},
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": spec.nodes,
                # One lost pod breaks the whole Ray group: restart the group together.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _leader_template(template, nodes=spec.nodes),
                "workerTemplate": _worker_template(template),
            },
        },
    }


def status_view(lws: dict[str, Any]) -> dict[str, Any]:
    """The LeaderWorkerSet's status in the Deployment's terms the ModelServer's status is judged on (a group counts
    as one replica; a ready group is available)."""
    status = lws.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    return {
        "metadata": {"generation": (lws.get("metadata") or {}).get("generation")},
        "status": {
            # Set by the controller to the generation its counts were taken at (LeaderWorkerSet v0.9 and later);
            # absent, the counts may be of an older spec, and the rollout reads as not done.
            "observedGeneration": status.get("observedGeneration"),
            "replicas": int(status.get("replicas") or 0),
            "readyReplicas": ready,
            "updatedReplicas": int(status.get("updatedReplicas") or 0),
            "availableReplicas": ready,
        },
    }
