"""use_pdl: on for sm_90 and later, off by the switch or off CUDA; the GPU is asked its capability once."""

import pytest
import torch

from moelora.kernels import _pdl


@pytest.mark.parametrize(("capability", "on"), [((9, 0), True), ((10, 0), True), ((8, 9), False)])
def test_on_from_sm_90_and_the_capability_asked_once(monkeypatch, capability, on) -> None:
    asked: list[object] = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: asked.append(index) or capability)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MOELORA_DISABLE_PDL", raising=False)
    _pdl._capability.cache_clear()
    cuda = torch.device("cuda", 0)
    assert [_pdl.use_pdl(cuda) for _ in range(3)] == [on] * 3 and asked == [0]
    monkeypatch.setenv("MOELORA_DISABLE_PDL", "1")  # the switch is read on every call
    assert not _pdl.use_pdl(cuda)
    _pdl._capability.cache_clear()


def test_off_on_the_cpu_and_under_the_interpreter(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    _pdl._capability.cache_clear()
    assert not _pdl.use_pdl(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _pdl.use_pdl(torch.device("cuda", 0))
    _pdl._capability.cache_clear()
