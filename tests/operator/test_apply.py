from __future__ import annotations

import json

from moelora.operator.kube import apply


def deployment(pod_spec: dict, annotations: dict | None = None) -> dict:
    template: dict = {"metadata": {"labels": {"a": "b"}}, "spec": pod_spec}
    if annotations is not None:
        template["metadata"]["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "n"},
        "spec": {"replicas": 1, "template": template},
    }


def test_dropped_optional_fields_are_removed() -> None:
    actual = deployment(
        {
            "containers": [],
            "nodeSelector": {"gpu": "h200"},
            "tolerations": [{"key": "x"}],
            "initContainers": [{"name": "fetch"}],
            "dnsPolicy": "ClusterFirst",
        }
    )
    desired = deployment({"containers": []})
    patch = apply.update_patch(actual, desired)
    pod = patch["spec"]["template"]["spec"]
    assert pod["nodeSelector"] is None and pod["tolerations"] is None and pod["initContainers"] is None
    assert "dnsPolicy" not in pod  # a server default we never set stays alone


def test_owned_maps_are_replaced_not_merged() -> None:
    actual = deployment(
        {"containers": [], "nodeSelector": {"gpu": "h200", "zone": "a"}, "affinity": {"nodeAffinity": {"x": 1}}}
    )
    desired = deployment({"containers": [], "nodeSelector": {"gpu": "b200"}, "affinity": {"podAntiAffinity": {"y": 2}}})
    pod = apply.update_patch(actual, desired)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "b200", "zone": None}
    assert pod["affinity"] == {"podAntiAffinity": {"y": 2}, "nodeAffinity": None}


def test_only_our_template_annotations_are_removed() -> None:
    actual = deployment(
        {"containers": []},
        annotations={"moelora.io/kernel-configs-hash": "abc", "kubectl.kubernetes.io/restartedAt": "now"},
    )
    desired = deployment({"containers": []}, annotations={})
    annotations = apply.update_patch(actual, desired)["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"moelora.io/kernel-configs-hash": None}


def test_config_map_keys_no_longer_rendered_are_removed() -> None:
    actual = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "n"},
        "data": {"old.json": "{}", "kept.json": "{}"},
    }
    desired = {**actual, "data": {"kept.json": '{"1": {}}'}}
    assert apply.update_patch(actual, desired)["data"] == {"kept.json": '{"1": {}}', "old.json": None}


def test_hash_is_stable_and_content_sensitive() -> None:
    one = deployment({"containers": [{"name": "a"}]})
    assert apply.desired_hash(one) == apply.desired_hash(deployment({"containers": [{"name": "a"}]}))
    assert apply.desired_hash(one) != apply.desired_hash(deployment({"containers": [{"name": "b"}]}))


def test_our_annotations_go_when_the_template_has_none_left() -> None:
    actual = deployment({"containers": []}, annotations={"moelora.io/kernel-configs-hash": "abc", "other": "x"})
    desired = deployment({"containers": []})
    assert apply.update_patch(actual, desired)["spec"]["template"]["metadata"]["annotations"] == {
        "moelora.io/kernel-configs-hash": None
    }
    untouched = apply.update_patch(deployment({"containers": []}, annotations={"other": "x"}), desired)
    assert "annotations" not in untouched["spec"]["template"]["metadata"]


def test_drift_is_a_changed_field_we_set_not_one_the_server_or_others_added() -> None:
    desired = deployment(
        {"containers": [{"name": "vllm", "image": "vllm:0.26", "env": [{"name": "A", "value": "1"}]}]},
        annotations={"moelora.io/desired-hash": "h"},
    )
    # The API server's defaults, status, and someone else's annotation: not drift.
    served = deployment(
        {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm:0.26",
                    "env": [{"name": "A", "value": "1"}],
                    "imagePullPolicy": "IfNotPresent",
                    "terminationMessagePath": "/dev/x",
                }
            ],
            "dnsPolicy": "ClusterFirst",
        },
        annotations={"moelora.io/desired-hash": "h", "kubectl.kubernetes.io/restartedAt": "now"},
    )
    served["status"] = {"readyReplicas": 1}
    served["metadata"]["resourceVersion"] = "7"
    assert not apply.drifted(served, desired)
    # A hand edit of a field we set, an env var added, a replica count changed: drift.
    edited = json.loads(json.dumps(served))
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    assert apply.drifted(edited, desired)
    added = json.loads(json.dumps(served))
    added["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "B", "value": "2"})
    assert apply.drifted(added, desired)
    scaled = json.loads(json.dumps(served))
    scaled["spec"]["replicas"] = 3
    assert apply.drifted(scaled, desired)


def test_only_a_controller_reference_to_the_server_makes_an_object_ours() -> None:
    def obj(*refs: dict) -> dict:
        return {"metadata": {"ownerReferences": list(refs)}} if refs else {"metadata": {}}

    assert apply.owned_by(obj({"uid": "u1", "controller": True}), "u1")
    assert not apply.owned_by(obj(), "u1")
    assert not apply.owned_by(obj({"uid": "u2", "controller": True}), "u1")
    # Anyone who may edit an object may add a plain reference: that does not hand it to us.
    assert not apply.owned_by(obj({"uid": "u1"}), "u1")
    assert not apply.owned_by(obj({"uid": "u1", "controller": False}, {"uid": "u2", "controller": True}), "u1")


def test_a_selector_that_no_longer_asks_for_leaders_drops_the_label() -> None:
    leaders = {"moelora.io/model-server": "s", "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"selector": leaders}}
    desired = {**service, "spec": {"selector": {"moelora.io/model-server": "s"}}}
    patch = apply.update_patch(service, desired)
    assert patch["spec"]["selector"] == {
        "moelora.io/model-server": "s",
        "leaderworkerset.sigs.k8s.io/worker-index": None,
    }
    pool = {"spec": {"selector": {"matchLabels": leaders}}}
    patch = apply.update_patch(pool, {"spec": {"selector": {"matchLabels": {"moelora.io/model-server": "s"}}}})
    assert patch["spec"]["selector"]["matchLabels"]["leaderworkerset.sigs.k8s.io/worker-index"] is None


def test_a_leader_worker_sets_templates_lose_dropped_fields_too() -> None:
    def lws(pod_spec: dict) -> dict:
        group = {name: {"metadata": {}, "spec": dict(pod_spec)} for name in ("leaderTemplate", "workerTemplate")}
        return {"spec": {"leaderWorkerTemplate": group}}

    patch = apply.update_patch(lws({"containers": [], "nodeSelector": {"gpu": "h200"}}), lws({"containers": []}))
    for name in ("leaderTemplate", "workerTemplate"):
        assert patch["spec"]["leaderWorkerTemplate"][name]["spec"]["nodeSelector"] is None
