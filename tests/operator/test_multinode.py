"""A ModelServer over several nodes: a LeaderWorkerSet running vLLM across each group over Ray."""

from __future__ import annotations

import copy
import datetime
import subprocess

import pytest

from moelora.api import AdapterCounts, ModelServerStatus
from moelora.operator.decide.status import model_server_status
from moelora.operator.errors import SpecProblem
from moelora.operator.render import multinode
from moelora.operator.render.children import OPTIONAL_CHILDREN, Surroundings, desired_children
from moelora.operator.settings import Settings

from .conftest import k8s_valid, make_spec
from .published import problems

# kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go: WorkerIndexLabelKey, "0" on the leader.
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# kubernetes-sigs/lws site docs (reference: labels, annotations and environment variables): the leader's address.
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
MULTI = {"nodes": 2, "gpus": 8, "replicas": 3}
LEADERS = {"moelora.io/model-server": "srv", LWS_WORKER_INDEX_LABEL: "0"}


def render(settings: Settings, **overrides: object) -> dict[str, dict]:
    children = desired_children(
        make_spec(**{**MULTI, **overrides}),
        name="srv",
        namespace="ns",
        settings=settings,
        kernel_bundle=None,
        surroundings=Surroundings(),
    )
    return {child["kind"]: child for child in children}


def containers(template: dict) -> dict[str, dict]:
    return {container["name"]: container for container in template["spec"]["containers"]}


def pod_template(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}


def test_a_leader_worker_set_replaces_the_deployment(settings: Settings) -> None:
    children = render(settings)
    assert "Deployment" not in children
    assert ("apps/v1", "Deployment") in OPTIONAL_CHILDREN  # so the single-node one is deleted
    lws = children["LeaderWorkerSet"]
    assert problems(lws) == []  # the published LeaderWorkerSet CRD stores it as rendered
    group = lws["spec"]["leaderWorkerTemplate"]
    assert (lws["spec"]["replicas"], group["size"]) == (3, 2)
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        k8s_valid(pod_template(template))
        assert template["metadata"]["labels"]["moelora.io/model-server"] == "srv"
        assert containers(template)["vllm"]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_the_leader_runs_the_ray_head_then_vllm_across_the_group(settings: Settings) -> None:
    leader = render(settings)["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    vllm = containers(leader)["vllm"]
    assert vllm["command"][:2] == ["/bin/sh", "-c"]
    script = vllm["command"][2]
    assert "ray start --head --port=6379" in script and "< 2:" in script
    assert 'exec python3 -m vllm.entrypoints.openai.api_server "$@"' in script
    args = vllm["args"]
    for flag, value in (
        ("--tensor-parallel-size", "8"),
        ("--pipeline-parallel-size", "2"),
        ("--distributed-executor-backend", "ray"),
    ):
        assert args[args.index(flag) + 1] == value
    assert "agent" in containers(leader)  # adapters are loaded through the leader
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"


def test_the_leader_script_is_valid_shell(settings: Settings) -> None:
    group = render(settings)["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        script = containers(template)["vllm"]["command"][2]
        subprocess.run(["/bin/sh", "-n", "-c", script], check=True)


def test_workers_join_the_leader_and_carry_no_agent(settings: Settings) -> None:
    worker = render(settings)["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert set(containers(worker)) == {"vllm"}
    vllm = containers(worker)["vllm"]
    assert f"${LWS_LEADER_ADDRESS_ENV}:6379" in vllm["command"][2] and "--block" in vllm["command"][2]
    assert "args" not in vllm and "readinessProbe" not in vllm
    assert "kube-api-access" not in {volume["name"] for volume in worker["spec"]["volumes"]}


def test_the_service_pool_and_scale_selector_pick_leaders_only(settings: Settings) -> None:
    routed = {"routing": {"gateway": {"enabled": True, "parentRefs": [{"name": "gw"}]}}}
    children = render(settings, **routed)
    assert children["Service"]["spec"]["selector"] == LEADERS
    assert children["InferencePool"]["spec"]["selector"]["matchLabels"] == LEADERS
    assert multinode.WORKER_INDEX_LABEL == LWS_WORKER_INDEX_LABEL
    status = multi_status(deployment=None)
    assert status.selector == f"moelora.io/model-server=srv,{LWS_WORKER_INDEX_LABEL}=0"


def test_one_node_stays_a_deployment(settings: Settings) -> None:
    children = render(settings, nodes=1)
    assert "LeaderWorkerSet" not in children and "Deployment" in children
    assert children["Service"]["spec"]["selector"] == {"moelora.io/model-server": "srv"}


def test_the_groups_readiness_reads_as_replicas() -> None:
    view = multinode.status_view(
        {
            "metadata": {"generation": 4},
            "status": {"observedGeneration": 4, "replicas": 3, "readyReplicas": 2, "updatedReplicas": 3},
        }
    )
    assert view["status"] == {
        "observedGeneration": 4,
        "replicas": 3,
        "readyReplicas": 2,
        "updatedReplicas": 3,
        "availableReplicas": 2,
    }


def multi_status(*, deployment: dict | None) -> ModelServerStatus:
    """The status of a multi-node server at generation 1 whose workload reads as `deployment`."""
    return model_server_status(
        make_spec(**MULTI),
        name="srv",
        namespace="ns",
        generation=1,
        deployment=deployment,
        problem=None,
        adapters=AdapterCounts(),
        previous=ModelServerStatus(),
        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )


def progressing_reason(lws_status: dict) -> str:
    """The server's Progressing reason with its LeaderWorkerSet at generation 4 reporting `lws_status`."""
    view = multinode.status_view({"metadata": {"generation": 4}, "status": lws_status})
    status = multi_status(deployment=view)
    [progressing] = [c for c in status.conditions if c.type == "Progressing"]
    return progressing.reason


def test_the_rollout_is_done_only_once_the_controller_saw_the_current_generation() -> None:
    """LeaderWorkerSet v0.9+ writes status.observedGeneration = metadata.generation with the counts it took
    (kubernetes-sigs/lws pkg/controllers/leaderworkerset_controller.go, updateStatus): counts of generation 3 say
    nothing of the spec of generation 4, however ready they look."""
    counts = {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3}
    assert progressing_reason({**counts, "observedGeneration": 4}) == "RolledOut"
    assert progressing_reason({**counts, "observedGeneration": 3}) == "RollingOut"
    assert progressing_reason(counts) == "RollingOut"  # not observed yet (or a controller older than v0.9)


def test_the_headless_service_of_the_lws_name_is_left_to_its_controller(settings: Settings) -> None:
    """The LWS controller creates a headless Service named after the LeaderWorkerSet unless one of that name
    exists, and each pod's LWS_LEADER_ADDRESS is <lws>-<group>.<lws>.<namespace> through it (kubernetes-sigs/lws
    reconcileHeadlessServices, pkg/utils/pod/pod_utils.go): no Service of ours may take that name."""
    routed = {"routing": {"gateway": {"enabled": True, "parentRefs": [{"name": "gw"}]}}}
    children = desired_children(
        make_spec(**MULTI, **routed),
        name="srv",
        namespace="ns",
        settings=settings,
        kernel_bundle=None,
        surroundings=Surroundings(),
    )
    [lws] = [child for child in children if child["kind"] == "LeaderWorkerSet"]
    services = {child["metadata"]["name"]: child for child in children if child["kind"] == "Service"}
    assert lws["metadata"]["name"] not in services
    assert (multinode.LWS_API_VERSION, "LeaderWorkerSet") in OPTIONAL_CHILDREN
    assert lws["metadata"]["name"] in [
        n("srv") for n in OPTIONAL_CHILDREN[(multinode.LWS_API_VERSION, "LeaderWorkerSet")]
    ]
    # Clients, the pool and the route reach the leaders through ours, which keeps the server's name.
    assert list(services) == ["srv"] and services["srv"]["spec"]["selector"] == LEADERS
    assert services["srv"]["spec"]["type"] == "ClusterIP"
    [pool] = [child for child in children if child["kind"] == "InferencePool"]
    [route] = [child for child in children if child["kind"] == "HTTPRoute"]
    assert pool["spec"]["selector"]["matchLabels"] == LEADERS
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == pool["metadata"]["name"]
    status = multi_status(deployment=None)
    assert status.endpoint == "http://srv.ns.svc:8000/v1"


def test_placement_over_several_nodes_is_refused(settings: Settings) -> None:
    with pytest.raises(SpecProblem) as caught:
        render(settings, placement={"copies": 1})
    assert caught.value.reason == "PlacementMultiNode"
    assert "nodes 1" in caught.value.message
    assert "StatefulSet" in render(settings, nodes=1, placement={"copies": 1})


def test_a_name_whose_group_statefulsets_could_not_create_pods_is_refused(settings: Settings) -> None:
    """The LWS's worker StatefulSets are <lws>-<group>; the StatefulSet controller labels each pod
    controller-revision-hash=<statefulset>-<hash>, which must fit a label value's 63 characters."""

    def render_named(name: str, **overrides: object) -> list[dict]:
        return desired_children(
            make_spec(**{**MULTI, **overrides}),
            name=name,
            namespace="ns",
            settings=settings,
            kernel_bundle=None,
            surroundings=Surroundings(),
        )

    fits = "s" * (multinode.MAX_STATEFULSET_NAME - len(multinode.LWS_SUFFIX) - 2)  # 3 replicas: groups 0..2
    [lws] = [c for c in render_named(fits) if c["kind"] == "LeaderWorkerSet"]
    assert len(f"{lws['metadata']['name']}-2") == multinode.MAX_STATEFULSET_NAME
    for name, overrides in ((fits + "s", {}), (fits, {"autoscaling": {"minReplicas": 1, "maxReplicas": 11}})):
        with pytest.raises(SpecProblem) as caught:
            render_named(name, **overrides)
        assert caught.value.reason == "NameTooLongForNodes"


def test_the_published_crd_refuses_a_broken_leader_worker_set(settings: Settings) -> None:
    lws = copy.deepcopy(render(settings)["LeaderWorkerSet"])
    group = lws["spec"]["leaderWorkerTemplate"]
    group["restartPolicy"] = "Always"
    group["sizeOfGroup"] = 2
    del group["workerTemplate"]
    assert problems(lws) == [
        "spec.leaderWorkerTemplate.workerTemplate: Required value",
        'spec.leaderWorkerTemplate.restartPolicy: Unsupported value: "Always": supported values: "Default", '
        '"RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"',
        "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct "
        "the existing errors to complete validation",
        "spec.leaderWorkerTemplate.sizeOfGroup: pruned (not in the schema)",
    ]


def test_engine_args_may_not_set_the_groups_parallelism(settings: Settings) -> None:
    for flag in ("--pipeline-parallel-size=4", "-pp", "--distributed-executor-backend=mp"):
        args = [flag] if "=" in flag else [flag, "4"]
        with pytest.raises(SpecProblem) as caught:
            render(settings, engineArgs=args)
        assert caught.value.reason == "ManagedEngineFlag"
    assert "Deployment" in render(settings, nodes=1, engineArgs=["--pipeline-parallel-size=2"])


def test_a_taken_leader_worker_set_name_keeps_the_deployment(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moelora.operator.control import model_servers
    from moelora.operator.kube import apply

    deleted: list[str] = []

    def ensure(*, api: object, desired: dict, owner_uid: str, create: bool = True) -> tuple[dict, str]:
        if desired["kind"] == "LeaderWorkerSet":
            raise apply.NotOwned("LeaderWorkerSet", "srv")
        return desired, "created"

    def delete_if_owned(*, kind: str, **_: object) -> bool:
        deleted.append(kind)
        return True

    monkeypatch.setattr(apply, "ensure", ensure)
    monkeypatch.setattr(apply, "delete_if_owned", delete_if_owned)
    monkeypatch.setattr(apply, "list_owned", lambda **_: [])
    owner = {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "srv", "namespace": "ns", "uid": "u1"},
    }
    children = list(render(settings).values())
    _, problem = model_servers.apply_children(api=None, children=children, owner=owner)  # type: ignore[arg-type]
    assert problem is not None and problem.reason == "NameTaken"
    assert "Deployment" not in deleted


def test_leaders_and_workers_share_the_compile_cache_claim(settings: Settings) -> None:
    lws = render(settings, kernels={"compileCache": {"claimName": "compiled"}})["LeaderWorkerSet"]
    group = lws["spec"]["leaderWorkerTemplate"]
    subpaths = set()
    for template in (group["leaderTemplate"], group["workerTemplate"]):  # workers compile too: Ray runs vLLM there
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["compile-cache"]["persistentVolumeClaim"] == {"claimName": "compiled"}
        vllm = containers(template)["vllm"]
        (mount,) = [m for m in vllm["volumeMounts"] if m["name"] == "compile-cache"]
        subpaths.add(mount["subPath"])
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        assert env["TRITON_CACHE_DIR"].startswith(mount["mountPath"])
        assert env["VLLM_CACHE_ROOT"].startswith(mount["mountPath"])
    assert len(subpaths) == 1  # one image, one directory
