"""The split-K one-launch dense LoRA against PyTorch: rows without an adapter, several adapters, a group over two row
blocks, partial K and N tiles, several K splits and expand programs, both epilogues, counters back at zero.

Triton's interpreter runs the one-dimensional grid in program-id order, so every shrink (producer) program has run
before the first expand program waits on its counter: the kernel's producers-first ids are what keep this from
hanging here.
"""

from __future__ import annotations

import pytest
import torch

from moelora.kernels import dense_splitk as splitk
from moelora.kernels.dense_config import dense_layout

from .test_dense_one_launch import _meta, _reference

MIXED = [2, -1, 0, 2, 2, -1, 1, 0] + [2] * 15  # 18 rows of slot 2: two row blocks of 16; 5 blocks, the bound's 5
WHOLE = [1] * 16 + [0] * 3  # one whole block and one of 3: 2 blocks under a bound of 3 (a unit with no rows)


@pytest.mark.parametrize(
    ("add", "k", "split_k", "n_chunks", "slots"),
    [
        (True, 48, 3, 2, MIXED),  # three K splits of one tile, SPLIT_PAD 4 (one padded split)
        (False, 48, 3, 2, MIXED),
        (True, 40, 2, 3, MIXED),  # the last K tile partial, splits of two tiles and one
        (False, 40, 1, 1, MIXED),  # one split, one expand program per slice
        (False, 72, 8, 4, MIXED),  # split_k above the five K tiles: five splits
        (True, 48, 2, 2, WHOLE),
    ],
)
def test_splitk_matches_shrink_then_expand(add: bool, k: int, split_k: int, n_chunks: int, slots: list[int]) -> None:
    torch.manual_seed(k + split_k)
    dtype, rank, widths, loras = torch.float16, 8, (40, 16, 24), 3
    mapping = torch.tensor(slots)
    x = torch.randn(mapping.numel(), k, dtype=dtype)
    lora_a = [torch.randn(loras, 1, rank, k, dtype=dtype) / 4 for _ in widths]
    lora_b = [torch.randn(loras, 1, n, rank, dtype=dtype) / 4 for n in widths]
    base = torch.randn(mapping.numel(), sum(widths), dtype=dtype)
    y = base.clone() if add else torch.full_like(base, float("nan"))  # written rows only: NaN stays where unwritten
    layout = dense_layout(lora_a, lora_b)
    run = dict(scale=0.5, add=add, split_k=split_k, block_k=16, n_chunks=n_chunks, block_n=16)
    splitk.dense_splitk(y, x, layout, _meta(mapping), **run)
    want = _reference(x, lora_a, lora_b, mapping, 0.5) + (base.double() if add else 0.0)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)
    # The counters are back at zero, so a second call (a graph replay) gives the same result.
    assert not splitk._counters[x.device].any()
    again = base.clone() if add else torch.full_like(base, float("nan"))
    splitk.dense_splitk(again, x, layout, _meta(mapping), **run)
    torch.testing.assert_close(again, y, atol=0, rtol=0)


def test_splitk_grid_covers_k_in_whole_tiles() -> None:
    assert splitk.splitk_grid(k=2880, block_k=128, split_k=8) == (8, 3)  # 23 tiles: 7 splits of 3, one of 2
    assert splitk.splitk_grid(k=4096, block_k=256, split_k=32) == (16, 1)
    assert splitk.splitk_grid(k=40, block_k=16, split_k=2) == (2, 2)


def test_outgrown_counter_words_are_kept_for_graphs_captured_with_them() -> None:
    device = torch.device("cpu")
    first = splitk._counter_words(device, 8)
    grown = splitk._counter_words(device, first.numel() + 1)
    assert grown.numel() > first.numel() and any(old is first for old in splitk._outgrown)
    assert splitk._counter_words(device, 8) is grown


@pytest.mark.parametrize("add", [True, False])
def test_rows_past_the_grouped_tokens_are_zeroed_when_writing_and_left_when_adding(add: bool) -> None:
    """vLLM pads a batch to a captured graph's size (13 decodes run at 16) and groups only the 13 tokens it scheduled:
    the 3 rows past them are in no group. Writing (the LoRA stream's own output, not filled first) they get zeros;
    adding (into the layer's output) they are left as they are."""
    torch.manual_seed(13)
    dtype, k, rank, widths, loras, real, rows = torch.float16, 48, 8, (40, 16, 24), 3, 13, 16
    mapping = torch.tensor(MIXED[:real])
    x = torch.randn(rows, k, dtype=dtype)
    lora_a = [torch.randn(loras, 1, rank, k, dtype=dtype) / 4 for _ in widths]
    lora_b = [torch.randn(loras, 1, n, rank, dtype=dtype) / 4 for n in widths]
    base = torch.randn(rows, sum(widths), dtype=dtype)
    y = base.clone() if add else torch.full_like(base, float("nan"))
    run = dict(scale=0.5, add=add, split_k=3, block_k=16, n_chunks=2, block_n=16)
    splitk.dense_splitk(y, x, dense_layout(lora_a, lora_b), _meta(mapping), **run)
    want = _reference(x[:real], lora_a, lora_b, mapping, 0.5) + (base[:real].double() if add else 0.0)
    torch.testing.assert_close(y[:real].double(), want, atol=2e-2, rtol=2e-2)
    assert torch.equal(y[real:], base[real:] if add else torch.zeros_like(base[real:]))


def test_padded_rows_start_after_every_grouped_token_even_past_the_groups_launched_for() -> None:
    """A graph captured for fewer groups than a replay has (vLLM's `specialize_active_lora`) computes only the first
    ones; the zeros for padded rows must still start after every token grouped, never inside a group's rows."""
    torch.manual_seed(7)
    dtype, k, rank, widths, loras, rows = torch.float16, 48, 8, (40, 16, 24), 3, 9
    mapping = torch.tensor([0, 1, -1, 1, 0, -1, 1])  # groups -1, 0, 1; rows 7 and 8 padded
    x = torch.randn(rows, k, dtype=dtype)
    lora_a = [torch.randn(loras, 1, rank, k, dtype=dtype) / 4 for _ in widths]
    lora_b = [torch.randn(loras, 1, n, rank, dtype=dtype) / 4 for n in widths]
    y = torch.full((rows, sum(widths)), float("nan"), dtype=dtype)
    order, counts, starts, ids, _ = _meta(mapping)
    run = dict(scale=0.5, add=False, split_k=3, block_k=16, n_chunks=2, block_n=16)
    splitk.dense_splitk(y, x, dense_layout(lora_a, lora_b), (order, counts, starts, ids, 2), **run)  # 2 of 3 groups
    want = _reference(x[:7], lora_a, lora_b, mapping, 0.5)
    computed = torch.tensor([0, 2, 4, 5])  # slot 0's rows and the rows without an adapter
    torch.testing.assert_close(y[computed].double(), want[computed], atol=2e-2, rtol=2e-2)
    assert torch.isnan(y[[1, 3, 6]]).all()  # slot 1's group was not launched for: untouched, not zeroed
    assert torch.equal(y[7:], torch.zeros_like(y[7:]))


def test_bench_dense_beside_prints_a_table_the_plugin_accepts() -> None:
    """The configs `bench_dense --beside` picks, printed for MOELORA_DENSE_SPLITK_CONFIGS, parse back to the same
    served table (M outside the served window left out, each kind's M rising whatever the order measured)."""
    from moelora.kernels.dense_config import SERVED, SplitKConfig, parse_served
    from moelora.kernels.tools.bench_dense import configs_text

    a, b, c, d = (SplitKConfig(4, 128, 4), SplitKConfig(8, 64, 8, num_warps=2), SplitKConfig(16, 64, 4), SplitKConfig())
    text = configs_text([(3, 64, b), (3, 1, d), (3, 16, a), (1, 16, c), (1, 64, d), (1, 65, a)])
    assert parse_served(text) == {"several": ((16, a), (64, b)), "one": ((16, c), (64, d))}
    assert parse_served(configs_text([(1, 32, c)])) == {"several": SERVED["several"], "one": ((32, c),)}


@pytest.mark.parametrize(("max_loras", "m"), [(8, 16), (8, 64), (8, 5), (4, 4)])
def test_bench_dense_beside_groups_tokens_as_vllm_does(max_loras: int, m: int) -> None:
    """`--beside` runs without vLLM: its grouping gives the tensors vLLM's LoRAKernelMeta gives for the same tokens."""
    pytest.importorskip("vllm")
    from moelora.kernels.tools.bench_dense import _grouping, torch_grouping

    _, want = _grouping(max_loras, m, torch.device("cpu"))
    got = torch_grouping(max_loras, m, torch.device("cpu"))
    assert got[4] == want[4]
    for g, w in zip(got[:4], want[:4], strict=True):
        assert g.dtype == w.dtype
        assert g.tolist() == w.tolist()
