"""``core.randomaccess`` and ``core.lru``: global numbers to (shard, position), spans of a batch, the LRU."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.lru import LRU
from fastload.core.randomaccess import locate, resolve, sample_starts, spans

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(st.lists(st.integers(0, 5), min_size=1, max_size=12))
def test_locate_numbers_samples_shard_after_shard(counts: list[int]) -> None:
    expected = [(s, p) for s, n in enumerate(counts) for p in range(n)]
    starts = sample_starts(counts)
    assert starts[-1] == len(expected)
    if expected:
        shards, positions = locate(starts, resolve(list(range(len(expected))), len(expected)))
        assert list(zip(shards.tolist(), positions.tolist(), strict=True)) == expected


def test_resolve_negative_and_out_of_range() -> None:
    assert resolve([-1, 0, -5], 5).tolist() == [4, 0, 0]
    with pytest.raises(IndexError, match="sample index 5 is out of range for a dataset of 5 samples"):
        resolve([1, 5], 5)
    with pytest.raises(IndexError, match="-6"):
        resolve([-6], 5)
    with pytest.raises(TypeError):
        resolve([1.5], 5)  # type: ignore[list-item]
    assert resolve(np.array([], dtype=np.int64), 0).tolist() == []


@SETTINGS
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=30),
    st.data(),
    st.integers(0, 120),
)
def test_spans_cover_exactly_the_positions_asked_and_gaps_within_the_bound(
    sizes: list[int], data: st.DataObject, gap: int
) -> None:
    offsets = np.cumsum([0, *sizes[:-1]]).tolist()
    asked = sorted(data.draw(st.sets(st.integers(0, len(sizes) - 1), min_size=1)))
    out = spans(asked, offsets, sizes, max_gap_bytes=gap)
    covered = [p for first, stop in out for p in range(first, stop)]
    assert set(asked) <= set(covered) and covered == sorted(set(covered))
    for first, stop in out:
        assert first in asked and stop - 1 in asked
        inside = [p for p in asked if first <= p < stop]
        for a, b in itertools.pairwise(inside):  # each gap between asked samples is small
            assert offsets[b] - (offsets[a] + sizes[a]) <= gap
    for (_, stop), (first, _) in itertools.pairwise(out):  # and every split was needed
        assert offsets[first] - (offsets[stop - 1] + sizes[stop - 1]) > gap
    if gap == 0:
        assert len(covered) == len(asked)


def test_lru_bounds_count_and_weight() -> None:
    lru: LRU[str, int] = LRU(max_items=2)
    assert lru.put("a", 1) == [] and lru.put("b", 2) == []
    assert lru.get("a") == 1  # now b is the oldest
    assert lru.put("c", 3) == [2] and "b" not in lru and len(lru) == 2
    assert lru.put("c", 4) == [3]
    heavy: LRU[str, str] = LRU(max_weight=10)
    heavy.put("x", "x", 6)
    assert heavy.put("y", "y", 6) == ["x"] and heavy.weight == 6
    assert heavy.put("z", "z", 50) == ["y"] and heavy.get("z") == "z"  # the newest stays, however heavy
    assert heavy.pop("z") == "z" and heavy.weight == 0 and heavy.clear() == []
