"""Pre-flight validation: every FailureReason it can give, on real files."""

import json
import pathlib

import pytest

from moelora.agent.check.validate import AdapterInfo, Limits, same_base_model, validate
from moelora.agent.errors import AdapterError
from moelora.api import FailureReason

from .conftest import BASE_MODEL, adapter_files

LIMITS = Limits(
    base_model=BASE_MODEL, max_rank=16, target_modules=frozenset({"q_proj", "k_proj", "v_proj"}), max_bytes=1 << 20
)


def write(directory: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    for relpath, data in files.items():
        (directory / relpath).parent.mkdir(parents=True, exist_ok=True)
        (directory / relpath).write_bytes(data)
    return directory


def reason_of(directory: pathlib.Path, limits: Limits = LIMITS) -> FailureReason:
    with pytest.raises(AdapterError) as caught:
        validate(directory, limits)
    return caught.value.reason


def test_a_good_adapter_reports_its_facts(tmp_path: pathlib.Path) -> None:
    files = adapter_files(rank=8, modules=["v_proj", "q_proj"])
    info = validate(write(tmp_path, files), LIMITS)
    assert info.rank == 8 and info.base_model == BASE_MODEL
    assert info.target_modules == ("q_proj", "v_proj")
    assert info.size_bytes == sum(len(d) for d in files.values())


def test_any_module_is_fine_when_the_server_names_none(tmp_path: pathlib.Path) -> None:
    write(tmp_path, adapter_files(modules=["gate_proj", "up_proj"]))
    assert validate(tmp_path, Limits(**{**LIMITS.__dict__, "target_modules": frozenset()})).rank == 8


def test_missing_config(tmp_path: pathlib.Path) -> None:
    files = adapter_files()
    del files["adapter_config.json"]
    assert reason_of(write(tmp_path, files)) is FailureReason.CONFIG_MISSING


@pytest.mark.parametrize(
    "text",
    [
        b"{not json",
        b"[1, 2]",
        b"\xff\xfe",
        json.dumps({"r": "8", "target_modules": ["q_proj"]}).encode(),
        json.dumps({"r": 8, "target_modules": []}).encode(),
        json.dumps({"r": 8, "target_modules": ["q_proj"], "peft_type": "IA3"}).encode(),
        json.dumps({"r": 8, "target_modules": ["q_proj"], "rank_pattern": {"q": 0}}).encode(),
    ],
)
def test_unparseable_or_malformed_config(tmp_path: pathlib.Path, text: bytes) -> None:
    write(tmp_path, {**adapter_files(), "adapter_config.json": text})
    assert reason_of(tmp_path) is FailureReason.CONFIG_INVALID


def test_rank_above_max(tmp_path: pathlib.Path) -> None:
    assert reason_of(write(tmp_path, adapter_files(rank=32))) is FailureReason.RANK_TOO_HIGH


def test_a_refusal_after_the_rank_was_read_carries_what_the_config_said(tmp_path: pathlib.Path) -> None:
    with pytest.raises(AdapterError) as refused:
        validate(write(tmp_path, adapter_files(rank=32, modules=["v_proj", "q_proj"])), LIMITS)
    assert refused.value.facts == AdapterInfo(rank=32, base_model=BASE_MODEL, target_modules=("q_proj", "v_proj"))


def test_rank_pattern_raises_the_rank(tmp_path: pathlib.Path) -> None:
    files = adapter_files(rank=8)
    config = json.loads(files["adapter_config.json"])
    files["adapter_config.json"] = json.dumps({**config, "rank_pattern": {"v_proj": 64}}).encode()
    assert reason_of(write(tmp_path, files)) is FailureReason.RANK_TOO_HIGH


@pytest.mark.parametrize(
    "base, ok",
    [
        (BASE_MODEL, True),
        (BASE_MODEL.upper() + "/", True),
        (f"hf://{BASE_MODEL}", True),
        ("moelora-test/other-model", False),
        ("tiny-llama", False),
    ],
)
def test_base_model_comparison(tmp_path: pathlib.Path, base: str, ok: bool) -> None:
    write(tmp_path, adapter_files(base=base))
    if ok:
        validate(tmp_path, LIMITS)
    else:
        assert reason_of(tmp_path) is FailureReason.BASE_MODEL_MISMATCH
    assert same_base_model(BASE_MODEL, base) is ok


def test_adapter_naming_no_base_model_is_refused(tmp_path: pathlib.Path) -> None:
    files = adapter_files()
    config = json.loads(files["adapter_config.json"])
    config["base_model_name_or_path"] = None
    files["adapter_config.json"] = json.dumps(config).encode()
    assert reason_of(write(tmp_path, files)) is FailureReason.BASE_MODEL_MISMATCH


@pytest.mark.parametrize("modules", [["q_proj", "gate_proj"], ".*proj", "all-linear"])
def test_target_modules_outside_the_allowed_set(tmp_path: pathlib.Path, modules: list[str] | str) -> None:
    assert reason_of(write(tmp_path, adapter_files(modules=modules))) is FailureReason.UNSUPPORTED_TARGET_MODULES


@pytest.mark.parametrize("name", ["adapter_model.bin", "training_args.bin", "sub/weights.pt", "x.PTH"])
def test_pickle_files_are_refused(tmp_path: pathlib.Path, name: str) -> None:
    write(tmp_path, {**adapter_files(), name: b"\x80\x04pickle"})
    assert reason_of(tmp_path) is FailureReason.UNSAFE_WEIGHTS_FORMAT


def test_missing_or_empty_weights(tmp_path: pathlib.Path) -> None:
    files = adapter_files()
    del files["adapter_model.safetensors"]
    assert reason_of(write(tmp_path / "a", files)) is FailureReason.WEIGHTS_MISSING
    assert (
        reason_of(write(tmp_path / "b", {**files, "adapter_model.safetensors": b""})) is FailureReason.WEIGHTS_MISSING
    )


def test_too_large(tmp_path: pathlib.Path) -> None:
    assert reason_of(write(tmp_path, adapter_files(extra_bytes=2 << 20))) is FailureReason.TOO_LARGE


def test_symlinks_are_refused(tmp_path: pathlib.Path) -> None:
    write(tmp_path, adapter_files())
    (tmp_path / "link").symlink_to("/etc/passwd")
    assert reason_of(tmp_path) is FailureReason.UNSAFE_KEY
