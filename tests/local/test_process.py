"""Local process helpers: the ports handed to the local stack's servers."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from moelora.local import process


class _Offering:
    """A socket whose OS-picked port comes from a script, as the kernel may offer a just-closed port again."""

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


def test_free_ports_are_bindable() -> None:
    port = process.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
