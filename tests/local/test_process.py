"""Local process helpers: the ports handed to the local stack's servers."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from moelora.local import process


class _Offering:
    """A socket whose bound port comes from a script, as a port may be offered again once its first user closed it."""

    ports: list[int] = []

    def __init__(self, *_: Any) -> None:
        self.port = self.ports.pop(0)

    def __enter__(self) -> _Offering:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def bind(self, _: Any) -> None:
        pass

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_a_port_offered_again_is_not_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pod's vLLM and agent once got the same port this way: the agent bound it first and vLLM died (EADDRINUSE).
    monkeypatch.setattr(process, "_handed_out", set())
    monkeypatch.setattr(_Offering, "ports", [40001, 40001, 40001, 40002])
    monkeypatch.setattr(process.socket, "socket", _Offering)
    assert [process.free_port(), process.free_port()] == [40001, 40002]


def test_free_ports_lie_below_the_ephemeral_range_where_connections_take_theirs() -> None:
    # The chaos run's parked agent bound its status port seconds after it was handed out; once an outbound
    # connection had taken that port in between, and the agent exited at its bind (EADDRINUSE).
    low = process.ephemeral_range()[0]
    if low - process.PORT_FLOOR < 1000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it")
    ports = [process.free_port() for _ in range(50)]
    assert all(process.PORT_FLOOR <= port < low for port in ports)
    assert len(set(ports)) == 50


def test_a_port_someone_holds_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        picks = iter([taken, 0])  # then any port the OS picks
        monkeypatch.setattr(process._random, "randrange", lambda *_: next(picks))
        monkeypatch.setattr(process, "_handed_out", set())
        assert process.free_port() != taken


def test_free_ports_are_bindable() -> None:
    port = process.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
