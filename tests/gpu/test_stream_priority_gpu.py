"""What lora_stream.install_stream_priority relies on, on a real GPU: the stream it has vLLM make has the device's
highest priority, and a CUDA graph captured on that stream carries the priority on its kernel nodes (vLLM replays
its decode steps as graphs, so a priority lost at capture would change nothing served). The nodes are read back
through the driver's graph API.

Run as tests/gpu is (its own pytest process, PYTHONPATH=kernels:image, no TRITON_INTERPRET)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from moelora.vllm_plugin import lora_stream

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

_KERNEL_NODE = 0  # CU_GRAPH_NODE_TYPE_KERNEL
_PRIORITY = 8  # CU_LAUNCH_ATTRIBUTE_PRIORITY (CUkernelNodeAttrID is CUlaunchAttributeID)


def _kernel_priorities(stream: torch.cuda.Stream) -> list[int]:
    """The priority attribute of each kernel node of a graph of two kernels captured on `stream`."""
    cuda = ctypes.CDLL("libcuda.so.1")
    x = torch.zeros(1 << 16, device="cuda")
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph, stream=stream):
        x.add_(1)
        x.mul_(2)
    raw = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    assert cuda.cuGraphGetNodes(raw, None, ctypes.byref(count)) == 0
    nodes = (ctypes.c_void_p * count.value)()
    assert cuda.cuGraphGetNodes(raw, nodes, ctypes.byref(count)) == 0
    priorities = []
    for node in nodes:
        kind = ctypes.c_int(-1)
        assert cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) == 0
        if kind.value != _KERNEL_NODE:
            continue
        value = (ctypes.c_int * 16)()  # CUlaunchAttributeValue: a 64-byte union, the priority an int at its start
        assert cuda.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(node), _PRIORITY, ctypes.byref(value)) == 0
        priorities.append(value[0])
    graph.replay()
    torch.cuda.synchronize()
    assert x[0].item() == 2.0  # the graph ran as captured
    return priorities


def test_the_stream_has_the_devices_highest_priority() -> None:
    least, greatest = torch.cuda.Stream.priority_range()
    assert greatest < least  # the device has priorities to give
    assert lora_stream.new_stream().priority == greatest


def test_a_graph_captured_on_it_keeps_the_priority_and_one_on_a_default_stream_does_not() -> None:
    high = lora_stream.new_stream()
    assert _kernel_priorities(high) == [high.priority] * 2
    assert _kernel_priorities(torch.cuda.Stream()) == [0, 0]
