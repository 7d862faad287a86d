"""A resync of a settled ModelServer writes nothing: what the operator renders reads back from the API server as
rendered (the emulator stores built-in objects as the real server does, empty `omitempty` fields dropped), so no
child looks drifted and none is patched after the first apply."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from moelora.local.apiserver import KubeAPI, Rest
from moelora.local.apiserver.counting import CountingEmulator

from .cluster import DEPLOYMENTS, wait_for
from .conftest import running_operator

OPERATOR = "openapi-generator"  # the operator's handlers (kopf's own watches say `kopf`)
RESYNC = 0.5


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    api = KubeAPI()
    api.emulator = CountingEmulator()
    # No allowed S3 endpoints or buckets and no target modules: the agent's variables that were rendered as "".
    with api, running_operator(api, resync_seconds=RESYNC):
        yield api


def counter(kube: KubeAPI) -> CountingEmulator:
    assert isinstance(kube.emulator, CountingEmulator)
    return kube.emulator


def test_a_resync_of_a_settled_server_patches_nothing(kube: KubeAPI) -> None:
    server = {
        "apiVersion": "moelora.io/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "qwen-moe", "namespace": "quiet"},
        # A variable the user sets to "" is stored without a value too.
        "spec": {"model": {"name": "org/tiny-moe"}, "env": [{"name": "EMPTY", "value": ""}]},
    }
    Rest(url=kube.url).request(method="POST", path="/apis/moelora.io/v1alpha1/namespaces/quiet/modelservers",
                               body=server)  # fmt: skip
    wait_for(lambda: kube.get(DEPLOYMENTS, "quiet", "qwen-moe") is not None)
    time.sleep(4 * RESYNC)  # the first apply's echoes
    counter(kube).reset()
    time.sleep(8 * RESYNC)
    calls = counter(kube).requests
    reads = sum(count for (who, verb, resource), count in calls.items() if who == OPERATOR and verb == "get")
    assert reads >= 4, dict(calls)  # the resyncs ran
    writes = {key: count for key, count in calls.items() if key[0] == OPERATOR and key[1] != "get"}
    assert writes == {}, writes
