"""The pure packing plans (fastload.core.seqpack): worked examples and properties over random lengths."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.seqpack import (
    best_fit_decreasing,
    materialize,
    plan_from_blocks,
    plan_round,
    segment_ids,
)

SETTINGS = settings(max_examples=100, deadline=None)
FEWER = settings(max_examples=50, deadline=None)
LENGTHS = st.lists(st.integers(0, 90), max_size=40)


def _blocks(plan):
    return [
        list(zip(plan.item[a:b].tolist(), plan.start[a:b].tolist(), plan.length[a:b].tolist(), strict=True))
        for a, b in zip(plan.block_ptr[:-1], plan.block_ptr[1:], strict=True)
    ]


# --- worked examples ------------------------------------------------------------------------------------


def test_best_fit_decreasing_example() -> None:
    # 6 first (bin 0), 5 (bin 1), 4 fits bin 0 exactly... no: 6+4 = 10 fits, best fit is the tightest
    assign, fills = best_fit_decreasing([5, 6, 4, 3, 2], capacity=10)
    assert fills.tolist() == [10, 10]
    assert assign.tolist() == [1, 0, 0, 1, 1]
    assert best_fit_decreasing([], capacity=3)[1].tolist() == []
    with pytest.raises(ValueError, match="between 1 and capacity"):
        best_fit_decreasing([4], capacity=3)


def test_plan_round_example_split_and_order() -> None:
    # input 2 (9 tokens) splits into a full chunk of 8 (emitted first) and a 1-token tail
    plan = plan_round([5, 3, 9, 2, 4, 1], seq_len=8, final=True)
    assert _blocks(plan) == [
        [(2, 0, 8)],
        [(0, 0, 5), (1, 0, 3)],
        [(2, 8, 1), (3, 0, 2), (4, 0, 4), (5, 0, 1)],
    ]
    assert plan.truncated == 0 and plan.held_item.size == 0


def test_plan_round_truncate_counts_dropped_tokens() -> None:
    plan = plan_round([20, 3], seq_len=8, split="truncate", final=True)
    assert _blocks(plan) == [[(0, 0, 8)], [(1, 0, 3)]]
    assert plan.truncated == 12


def test_plan_round_holds_back_the_least_filled_block() -> None:
    plan = plan_round([6, 6, 2], seq_len=8)
    assert _blocks(plan) == [[(0, 0, 6), (2, 0, 2)]]
    assert plan.held_item.tolist() == [1] and plan.held_length.tolist() == [6]
    # a piece held back once is never held back again; a final round holds nothing
    again = plan_round([6, 5], seq_len=8, fresh=[False, True])
    assert again.held_item.tolist() == [1]
    assert plan_round([6, 6, 2], seq_len=8, final=True).held_item.size == 0
    assert plan_round([6], seq_len=8, fresh=[False]).blocks == 1


def test_plan_round_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        plan_round([1], seq_len=0)
    with pytest.raises(ValueError, match="split"):
        plan_round([1], seq_len=4, split="wrap")
    with pytest.raises(ValueError, match=">= 0"):
        plan_round([-1], seq_len=4)
    with pytest.raises(ValueError, match="fresh"):
        plan_round([1, 2], seq_len=4, fresh=[True])


def test_materialize_example() -> None:
    plan = plan_round([5, 3, 9, 2, 4, 1], seq_len=8, final=True)
    inputs = [np.arange(n) + 100 * (i + 1) for i, n in enumerate([5, 3, 9, 2, 4, 1])]
    blocks = materialize(inputs, plan, seq_len=8, pad_id=-1)
    assert blocks.input_ids.tolist()[1] == [100, 101, 102, 103, 104, 200, 201, 202]
    assert blocks.position_ids.tolist()[1] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert blocks.labels.tolist()[1] == [-100, 101, 102, 103, 104, -100, 201, 202]
    assert blocks.input_ids.tolist()[2] == [308, 400, 401, 500, 501, 502, 503, 600]
    cu = [blocks.cu_seqlens[a:b].tolist() for a, b in zip(blocks.cu_ptr[:-1], blocks.cu_ptr[1:], strict=True)]
    assert cu == [[0, 8], [0, 5, 8], [0, 1, 3, 7, 8]]
    padded = materialize([np.arange(3)], plan_round([3], seq_len=5, final=True), seq_len=5, pad_id=9)
    assert padded.input_ids.tolist() == [[0, 1, 2, 9, 9]]
    assert padded.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert padded.labels.tolist() == [[-100, 1, 2, -100, -100]]
    assert padded.cu_seqlens.tolist() == [0, 3, 5] and padded.fill.tolist() == [3]
    assert padded.max_seqlen.tolist() == [3]
    assert segment_ids(padded.cu_seqlens).tolist() == [0, 0, 0, 1, 1]
    keep = materialize(
        [np.arange(3)], plan_round([3], seq_len=5, final=True), seq_len=5, ignore_doc_starts=False
    )
    assert keep.labels.tolist() == [[0, 1, 2, -100, -100]]


def test_empty_round() -> None:
    plan = plan_round([0, 0], seq_len=4, final=True)
    assert plan.blocks == 0
    blocks = materialize([np.zeros(0), np.zeros(0)], plan, seq_len=4)
    assert blocks.input_ids.shape == (0, 4) and len(blocks) == 0


# --- properties -------------------------------------------------------------------------------------------


@SETTINGS
@given(
    lengths=LENGTHS,
    seq_len=st.integers(1, 64),
    split=st.sampled_from(["split", "truncate"]),
    final=st.booleans(),
    data=st.data(),
)
def test_plan_covers_every_token_once(
    lengths: list[int], seq_len: int, split: str, final: bool, data
) -> None:
    fresh = data.draw(st.lists(st.booleans(), min_size=len(lengths), max_size=len(lengths)))
    plan = plan_round(lengths, seq_len=seq_len, split=split, fresh=fresh, final=final)
    blocks = _blocks(plan)
    assert all(blocks) and all(sum(n for _, _, n in b) <= seq_len for b in blocks)
    held = list(
        zip(plan.held_item.tolist(), plan.held_start.tolist(), plan.held_length.tolist(), strict=True)
    )
    assert not (final and held)
    assert all(fresh[i] for i, _, _ in held) and sum(n for _, _, n in held) <= seq_len
    covered: dict[int, list[tuple[int, int]]] = {}
    for i, s, n in [p for b in blocks for p in b] + held:
        assert n > 0
        covered.setdefault(i, []).append((s, n))
    for i, n in enumerate(lengths):
        keep = n if split == "split" else min(n, seq_len)
        runs = sorted(covered.get(i, []))
        pos = 0
        for s, k in runs:
            assert s == pos
            pos += k
        assert pos == keep
    assert plan.truncated == (0 if split == "split" else sum(max(0, n - seq_len) for n in lengths))
    # a document's pieces come out in order (chunks before the tail; a held tail comes later anyway)
    for i in covered:
        emitted = [s for b in blocks for (j, s, _) in b if j == i]
        assert emitted == sorted(emitted)
    # deterministic
    again = plan_round(lengths, seq_len=seq_len, split=split, fresh=fresh, final=final)
    assert _blocks(again) == blocks


@FEWER
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30), seq_len=st.integers(1, 48))
def test_materialize_agrees_with_the_plan(lengths: list[int], seq_len: int) -> None:
    plan = plan_round(lengths, seq_len=seq_len, final=True)
    inputs = [1000 * (i + 1) + np.arange(n) for i, n in enumerate(lengths)]
    blocks = materialize(inputs, plan, seq_len=seq_len, pad_id=-7)
    assert (
        blocks.input_ids.shape == blocks.position_ids.shape == blocks.labels.shape == (plan.blocks, seq_len)
    )
    for b, pieces in enumerate(_blocks(plan)):
        cu = blocks.cu_seqlens[blocks.cu_ptr[b] : blocks.cu_ptr[b + 1]].tolist()
        ends = np.cumsum([n for _, _, n in pieces]).tolist()
        fill = ends[-1]
        assert cu == [0, *ends] + ([seq_len] if fill < seq_len else [])
        assert blocks.fill[b] == fill and blocks.max_seqlen[b] == max(np.diff(cu))
        row = blocks.input_ids[b]
        want = np.concatenate([inputs[i][s : s + n] for i, s, n in pieces])
        assert np.array_equal(row[:fill], want) and (row[fill:] == -7).all()
        for a, e in itertools.pairwise(cu):
            assert blocks.position_ids[b, a:e].tolist() == list(range(e - a))
            assert blocks.labels[b, a] == -100
        starts = set(cu[:-1])
        for t in range(seq_len):
            expect = -100 if t >= fill or t in starts else row[t]
            assert blocks.labels[b, t] == expect


@FEWER
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=20), seq_len=st.integers(30, 60))
def test_plan_from_blocks_rebuilds_the_same_blocks(lengths: list[int], seq_len: int) -> None:
    plan = plan_round(lengths, seq_len=seq_len, final=True)
    inputs = [7 * (i + 1) + np.arange(n) for i, n in enumerate(lengths)]
    blocks = materialize(inputs, plan, seq_len=seq_len)
    # what a checkpoint keeps: the real tokens, the piece lengths, the pieces per block
    real = [blocks.input_ids[b, : blocks.fill[b]] for b in range(plan.blocks)]
    flat = np.concatenate(real)
    pieces = np.split(flat, np.cumsum(plan.length)[:-1])
    again = materialize(pieces, plan_from_blocks(plan.length, np.diff(plan.block_ptr)), seq_len=seq_len)
    for name in ("input_ids", "position_ids", "labels", "cu_seqlens", "cu_ptr", "max_seqlen", "fill"):
        assert np.array_equal(getattr(blocks, name), getattr(again, name)), name


def test_plan_from_blocks_rejects_mismatched_counts() -> None:
    with pytest.raises(ValueError, match="pieces_per_block"):
        plan_from_blocks([1, 2], [3])


def test_waste_is_small_with_a_large_window() -> None:
    """Best-fit decreasing over a 1,000-document window: well under 1% padding at seq_len 2048."""
    rng = np.random.default_rng(5)
    lengths = np.clip(np.rint(rng.lognormal(np.log(150), 0.9, 1000)), 1, 2000).astype(int)
    plan = plan_round(lengths, seq_len=2048, final=True)
    assert plan.tokens == lengths.sum()
    waste = 1 - plan.tokens / (plan.blocks * 2048)
    assert waste < 0.01
