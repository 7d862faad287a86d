"""The agent's status writes for adapters it serves on demand: their load goes to `status.onDemandLoad.<pod>`, the
one place the operator reads a non-holder's load from, and goes again when the pod stops serving them on demand."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from moelora.agent.check.validate import AdapterInfo
from moelora.agent.reconcile import Desired, Record, Stage
from moelora.agent.report.publish import StatusPublisher
from moelora.api import LoRAAdapterSpec, ReplicaAdapterState


class Writer:
    def __init__(self) -> None:
        self.replicas: list[tuple[str, float | None]] = []
        self.on_demand: list[tuple[str, float | None]] = []

    def patch_replica(self, *, name: str, pod: str, state: ReplicaAdapterState, info: AdapterInfo | None) -> bool:
        self.replicas.append((name, state.load))
        return True

    def patch_on_demand_load(self, *, name: str, pod: str, load: float | None) -> bool:
        assert pod == "srv-3"
        self.on_demand.append((name, load))
        return True


def desired(name: str) -> Desired:
    spec = LoRAAdapterSpec.model_validate({"modelServer": "srv", "source": {"uri": f"s3://bkt/{name}/"}})
    return Desired(uid=f"uid-{name}", name=name, created="2026-01-01T00:00:00Z", spec=spec)


def loaded(item: Desired, load: float | None) -> Record:
    return Record(uid=item.uid, name=item.name, served_name=item.name, spec_hash="h", stage=Stage.LOADED, load=load)


@pytest.fixture
def publisher() -> Iterator[tuple[StatusPublisher, Writer]]:
    writer = Writer()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        yield StatusPublisher(kube=writer, pod="srv-3", pool=pool), writer


def test_load_served_on_demand_is_written_apart_from_the_placed_entries(
    publisher: tuple[StatusPublisher, Writer],
) -> None:
    publish, writer = publisher
    placed, held, idle = desired("placed"), desired("held"), desired("idle")
    records = {item.uid: loaded(item, load) for item, load in ((placed, 1.5), (held, 0.8), (idle, None))}
    publish.publish([placed], records)
    assert writer.replicas == [("placed", 1.5)]  # only the placed adapter has a status.replicas entry here
    assert writer.on_demand == [("held", 0.8)]  # the held one's load is not lost; an unsampled one writes nothing

    publish.publish([placed], records)  # nothing changed: nothing written
    assert writer.replicas == [("placed", 1.5)] and writer.on_demand == [("held", 0.8)]

    records[held.uid].load = 2.0
    publish.publish([placed], records)
    assert writer.on_demand[-1] == ("held", 2.0)

    records[held.uid].load = 0.0  # idle now: the key goes
    publish.publish([placed], records)
    assert writer.on_demand[-1] == ("held", None)


@pytest.mark.parametrize("change", ["placed here", "dropped"])
def test_the_on_demand_key_goes_when_the_pod_stops_serving_it_on_demand(
    publisher: tuple[StatusPublisher, Writer], change: str
) -> None:
    publish, writer = publisher
    held = desired("held")
    records = {held.uid: loaded(held, 0.8)}
    publish.publish([], records)
    assert writer.on_demand == [("held", 0.8)]
    if change == "placed here":  # its load goes to its status.replicas entry from now on
        publish.publish([held], records)
    else:  # dropped for room: the loop forgets its record
        publish.forget(held.uid)
        publish.publish([], {})
    assert writer.on_demand == [("held", 0.8), ("held", None)]
    publish.publish([held] if change == "placed here" else [], records if change == "placed here" else {})
    assert writer.on_demand == [("held", 0.8), ("held", None)]  # deleted once
