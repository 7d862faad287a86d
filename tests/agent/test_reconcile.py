"""The pure plan: desired adapters + what the agent knows + what vLLM serves -> actions."""

from moelora.agent.reconcile import Desired, Load, LoadedAdapter, Record, Stage, plan, ready, winners
from moelora.api import FailureReason, LoRAAdapterSpec

CACHE = "/cache"


def desired(
    name: str, *, created: str = "2026-01-01T00:00:00Z", served: str | None = None, uri: str = "s3://bkt/a/"
) -> Desired:
    spec = LoRAAdapterSpec.model_validate({"modelServer": "srv", "source": {"uri": uri}, "servedName": served})
    return Desired(uid=f"uid-{name}", name=name, created=created, spec=spec)


def record(item: Desired, stage: Stage, *, version: str = "v1", **changes: object) -> Record:
    path = f"{CACHE}/{version}" if stage in (Stage.READY, Stage.LOADED) else None
    rec = Record(
        uid=item.uid,
        name=item.name,
        served_name=item.served_name,
        spec_hash=item.spec_hash,
        stage=stage,
        version=version if path else None,
        path=path,
    )
    for key, value in changes.items():
        setattr(rec, key, value)
    return rec


def vllm(**paths: str) -> dict[str, LoadedAdapter]:
    return {name: LoadedAdapter(name=name, path=path, parent="base") for name, path in paths.items()}


def run(
    items: list[Desired],
    records: list[Record],
    loaded: dict[str, LoadedAdapter] | None,
    *,
    busy: set[str] = frozenset(),
    now: float = 100.0,
):  # type: ignore[assignment]
    return plan(desired=items, records={r.uid: r for r in records}, loaded=loaded, busy=busy, now=now)


def test_new_adapter_is_prepared_then_loaded() -> None:
    a = desired("a")
    assert run([a], [], vllm()).prepare == [a.uid]
    assert run([a], [], vllm(), busy={a.uid}).prepare == []
    assert run([a], [record(a, Stage.READY)], vllm()).load == [
        Load(uid=a.uid, served_name="a", path="/cache/v1", inplace=False)
    ]


def test_nothing_to_do_when_vllm_serves_the_right_files() -> None:
    a = desired("a")
    result = run([a], [record(a, Stage.LOADED)], vllm(a="/cache/v1"))
    assert (result.prepare, result.load, result.unload, result.adopt) == ([], [], [], [])


def test_vllm_restart_reloads_everything() -> None:
    a, b = desired("a"), desired("b", uri="s3://bkt/b/")
    records = [record(a, Stage.READY, version="v1"), record(b, Stage.READY, version="v2")]
    assert [load.served_name for load in run([a, b], records, vllm()).load] == ["a", "b"]


def test_new_version_reloads_in_place() -> None:
    a = desired("a")
    assert run([a], [record(a, Stage.READY, version="v2")], vllm(a="/cache/v1")).load == [
        Load(uid=a.uid, served_name="a", path="/cache/v2", inplace=True)
    ]


def test_found_already_loaded_after_an_agent_restart_is_adopted() -> None:
    a = desired("a")
    assert run([a], [record(a, Stage.READY)], vllm(a="/cache/v1")).adopt == [a.uid]


def test_spec_change_prepares_again_but_keeps_serving_meanwhile() -> None:
    old, new = desired("a"), desired("a", uri="s3://bkt/a2/")
    result = run([new], [record(old, Stage.LOADED)], vllm(a="/cache/v1"))
    assert result.prepare == [new.uid] and result.unload == []


def test_deleted_adapter_is_unloaded_and_forgotten() -> None:
    a = desired("a")
    result = run([], [record(a, Stage.LOADED)], vllm(a="/cache/v1"))
    assert result.unload == ["a"] and result.foreign == []
    assert result.forget == [a.uid]


def test_an_adapter_no_record_explains_is_foreign_wherever_its_files_are() -> None:
    a = desired("a")
    loaded = vllm(a="/cache/v1", intruder="/tmp/x", sneaky="/cache/v1", **{"evil\nname": "/cache/v9"})
    result = run([a], [record(a, Stage.LOADED)], loaded)
    assert result.foreign == ["evil\nname", "intruder", "sneaky"] and result.unload == []
    assert result.load == []  # the agent's own adapter is untouched


def test_a_desired_adapter_is_never_foreign_even_before_its_record_exists() -> None:
    a = desired("a")
    result = run([a], [], vllm(a="/cache/v1"))  # the agent just restarted
    assert result.foreign == [] and result.unload == [] and result.prepare == [a.uid]


def test_permanently_failed_adapter_is_not_served_nor_retried() -> None:
    a = desired("a")
    failed = record(a, Stage.FAILED, reason=FailureReason.RANK_TOO_HIGH, permanent=True, retry_at=0.0)
    result = run([a], [failed], vllm(a="/cache/v0"))
    assert result.unload == ["a"] and result.prepare == []


def test_transient_failure_is_retried_after_its_backoff() -> None:
    a = desired("a")
    failed = record(a, Stage.FAILED, reason=FailureReason.SOURCE_NOT_FOUND, permanent=False, retry_at=150.0)
    assert run([a], [failed], vllm(), now=100.0).prepare == []
    assert run([a], [failed], vllm(), now=151.0).prepare == [a.uid]


def test_only_a_refusal_for_room_is_retried_early_once_it_fits() -> None:
    a, b = desired("a"), desired("b")
    full = record(a, Stage.FAILED, reason=FailureReason.CACHE_FULL, permanent=True, retrying=True, retry_at=150.0)
    down = record(b, Stage.FAILED, reason=FailureReason.ENDPOINT_UNREACHABLE, permanent=False, retry_at=150.0)
    fits = {a.uid, b.uid}  # b's size would fit too, but room is not what it waits for
    result = plan(desired=[a, b], records={r.uid: r for r in (full, down)}, loaded=vllm(), busy=(), now=100, roomy=fits)
    assert result.prepare == [a.uid]
    assert run([a, b], [full, down], vllm(), now=100.0).prepare == []


def test_vllm_down_means_no_loads_and_no_unloads() -> None:
    a, gone = desired("a"), desired("gone")
    result = run([a], [record(a, Stage.READY), record(gone, Stage.LOADED)], None)
    assert result.load == [] and result.unload == [] and result.forget == [gone.uid]


def test_served_name_conflict_oldest_wins_whatever_the_order() -> None:
    young = desired("young", created="2026-02-01T00:00:00Z", served="shared")
    old = desired("old", created="2026-01-01T00:00:00Z", served="shared", uri="s3://bkt/b/")
    for order in ([young, old], [old, young]):
        chosen, losers = winners(order)
        assert [d.name for d in chosen] == ["old"] and losers == {young.uid: "old"}
        result = run(order, [], vllm())
        assert result.prepare == [old.uid] and result.conflicts == {young.uid: "old"}


def test_conflict_loser_takes_over_when_the_winner_goes() -> None:
    young = desired("young", served="shared")
    loser = record(young, Stage.FAILED, reason=FailureReason.NAME_CONFLICT, permanent=True, conflict_with="old")
    assert run([young], [loser], vllm()).prepare == [young.uid]


def test_one_bad_adapter_does_not_block_the_others() -> None:
    bad, good = desired("bad"), desired("good", uri="s3://bkt/g/")
    records = [
        record(bad, Stage.FAILED, reason=FailureReason.CONFIG_INVALID, permanent=True),
        record(good, Stage.READY, version="vg"),
    ]
    assert [load.served_name for load in run([bad, good], records, vllm()).load] == ["good"]


def test_ready_only_when_every_adapter_is_settled_and_vllm_is_up() -> None:
    a, b = desired("a"), desired("b")
    settled = {a.uid: record(a, Stage.LOADED), b.uid: record(b, Stage.FAILED, permanent=True)}
    assert ready(desired=[a, b], records=settled, vllm_up=True)
    assert not ready(desired=[a, b], records=settled, vllm_up=False)
    working = {**settled, b.uid: record(b, Stage.FAILED, permanent=False)}
    assert not ready(desired=[a, b], records=working, vllm_up=True)
    assert not ready(desired=[a, b], records={a.uid: settled[a.uid]}, vllm_up=True)
    assert ready(desired=[], records={}, vllm_up=True)


def test_record_state_for_the_status() -> None:
    a = desired("a")
    rec = record(a, Stage.PENDING)
    rec.fail(FailureReason.SOURCE_NOT_FOUND, "nothing under s3://bkt/a/", permanent=False, now=0.0)
    state = rec.state()
    # Waiting for its retry, nothing downloads: Pending, with the reason of the last attempt.
    assert (state.loaded, state.state.value, state.reason) == (False, "Pending", "SourceNotFound")
    for _ in range(5):  # transient failures that keep coming back end as Failed (still retried)
        rec.fail(FailureReason.SOURCE_NOT_FOUND, "again", permanent=False, now=0.0)
    assert rec.state().state.value == "Failed" and 16.0 <= rec.retry_at <= 32.0  # backoff with jitter
    loaded = record(a, Stage.LOADED).state()
    assert loaded.loaded and loaded.state.value == "Loaded" and loaded.version == "v1" and loaded.reason is None
    assert record(a, Stage.READY).state().state.value == "Pending"  # in the cache, vLLM not there to load it
    assert record(a, Stage.PREPARING).state().state.value == "Downloading"


def test_a_refused_update_shows_beside_the_served_version() -> None:
    rec = record(desired("a"), Stage.LOADED)
    assert rec.accept("v1", rec.path or "", None, ("v2", FailureReason.RANK_TOO_HIGH, "rank 64 > 16"), now=0.0)  # type: ignore[arg-type]
    state = rec.state()
    assert (state.loaded, state.version, state.rejected_version, state.reason) == (True, "v1", "v2", "UpdateRejected")
    assert "RankTooHigh" in (state.last_error or "")
    assert not rec.accept("v1", rec.path or "", None, ("v2", FailureReason.RANK_TOO_HIGH, "rank 64 > 16"), now=0.0)  # type: ignore[arg-type]
    rec.accept("v3", "/cache/v3", None, None, now=0.0)  # type: ignore[arg-type]
    assert rec.stage is Stage.READY and rec.rejected is None and rec.state().rejected_version is None
