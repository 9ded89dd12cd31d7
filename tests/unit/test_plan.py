"""Shard plans, write order and Parquet row groups: partitions of the samples with greedy, bounded pieces."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.plan import ShardPlan, plan_row_groups, plan_shards, sample_order

SETTINGS = settings(max_examples=200, deadline=None)
PARTS = st.sampled_from([None, "split=train", "split=val", "lang=日本"])


# --- plan_shards: worked examples ---------------------------------------------------------------------


def _ranges(plans: list[ShardPlan]) -> list[tuple[int, int]]:
    return [(p.start, p.stop) for p in plans]


def test_plan_shards_examples() -> None:
    kw = {"max_samples": None, "prefix": "shard", "suffix": ".tar"}
    # 10+10 = 20 <= 25, a third would make 30 > 25.
    assert _ranges(plan_shards([10, 10, 10], shard_bytes=25, **kw)) == [(0, 2), (2, 3)]
    # Exactly at the limit still fits.
    assert _ranges(plan_shards([10, 10], shard_bytes=20, **kw)) == [(0, 2)]
    # Overhead counts: 10 + 10 = 20 fits in 25, 10 + 10 + 10 does not.
    assert _ranges(plan_shards([10, 10], shard_bytes=25, overhead_bytes=10, **kw)) == [(0, 1), (1, 2)]
    # An oversized sample gets a shard of its own, and does not swallow its neighbours.
    assert _ranges(plan_shards([5, 100, 5], shard_bytes=20, **kw)) == [(0, 1), (1, 2), (2, 3)]
    assert _ranges(plan_shards([1] * 7, shard_bytes=100, max_samples=3, prefix="s", suffix="")) == [
        (0, 3),
        (3, 6),
        (6, 7),
    ]
    assert plan_shards([], shard_bytes=10, **kw) == []


def test_plan_shards_names_and_partitions() -> None:
    plans = plan_shards(
        [1, 1, 1, 1],
        ["split=train", "split=train", "split=val", "split=val"],
        shard_bytes=10**9,
        max_samples=None,
        prefix="data",
        suffix=".parquet",
    )
    assert plans == [
        ShardPlan(0, 0, 2, "split=train/data-000000.parquet", "split=train"),
        ShardPlan(1, 2, 4, "split=val/data-000001.parquet", "split=val"),
    ]
    assert [p.count for p in plans] == [2, 2]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shard_bytes": 0},
        {"shard_bytes": -1},
        {"shard_bytes": 10, "max_samples": 0},
        {"shard_bytes": 10, "max_samples": -3},
    ],
)
def test_plan_shards_invalid_arguments(kwargs: dict[str, int]) -> None:
    args = {"max_samples": None, "prefix": "s", "suffix": ".tar", **kwargs}
    with pytest.raises(ValueError, match="must be > 0"):
        plan_shards([1, 2], **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("partitions", [["a"], ["a", "a", "a"]])
def test_plan_shards_rejects_partitions_of_the_wrong_length(partitions: list[str]) -> None:
    """Like ``sample_order``, a ``partitions`` list that does not match ``sizes`` is a ValueError."""
    with pytest.raises(ValueError, match="partitions"):
        plan_shards([1, 1], partitions, shard_bytes=1, max_samples=None, prefix="s", suffix=".tar")


# --- plan_shards: properties --------------------------------------------------------------------------


@st.composite
def _shard_problems(draw: st.DrawFn) -> tuple[list[int], list[str | None] | None, int, int | None, int]:
    sizes = draw(st.lists(st.integers(0, 1000), max_size=40))
    partitions = draw(st.none() | st.lists(PARTS, min_size=len(sizes), max_size=len(sizes)))
    shard_bytes = draw(st.integers(1, 3000))
    max_samples = draw(st.none() | st.integers(1, 8))
    overhead = draw(st.integers(0, 600))
    return sizes, partitions, shard_bytes, max_samples, overhead


@SETTINGS
@given(_shard_problems(), st.sampled_from(["shard", "my.prefix"]), st.sampled_from([".tar", ".parquet", ""]))
def test_plan_shards_properties(
    problem: tuple[list[int], list[str | None] | None, int, int | None, int], prefix: str, suffix: str
) -> None:
    sizes, partitions, shard_bytes, max_samples, overhead = problem
    plans = plan_shards(
        sizes,
        partitions,
        shard_bytes=shard_bytes,
        max_samples=max_samples,
        prefix=prefix,
        suffix=suffix,
        overhead_bytes=overhead,
    )
    n = len(sizes)
    part = partitions if partitions is not None else [None] * n

    # The shards partition [0, n) in order: no gaps, no overlaps, none empty, numbered 0, 1, 2, ...
    assert [p.number for p in plans] == list(range(len(plans)))
    bounds = [0, *(p.stop for p in plans)]
    assert [p.start for p in plans] == bounds[:-1]
    assert bounds[-1] == n
    assert all(p.count == p.stop - p.start >= 1 for p in plans)

    name_re = re.compile(
        rf"^(?:(?P<part>[^/]+(?:/[^/]+)*)/)?{re.escape(prefix)}-(?P<num>\d{{6}}){re.escape(suffix)}$"
    )
    for k, p in enumerate(plans):
        size = overhead + sum(sizes[p.start : p.stop])
        assert size <= shard_bytes or p.count == 1
        if max_samples is not None:
            assert p.count <= max_samples
        # One partition per shard, recorded on the plan and in the name.
        assert len(set(part[p.start : p.stop])) == 1
        assert p.partition == part[p.start]
        folder = f"{p.partition}/" if p.partition else ""
        assert p.name == f"{folder}{prefix}-{k:06d}{suffix}"
        match = name_re.match(p.name)
        assert match is not None and int(match["num"]) == k and match["part"] == p.partition

        # Greedy: the shard stopped only because the next sample would break a limit or change partition.
        if p.stop < n:
            overflow = overhead + sum(sizes[p.start : p.stop + 1]) > shard_bytes
            too_many = max_samples is not None and p.count == max_samples
            new_part = part[p.stop] != part[p.start]
            assert overflow or too_many or new_part

    # Every partition change starts a new shard.
    starts = {p.start for p in plans}
    assert all(i in starts for i in range(1, n) if part[i] != part[i - 1])


@SETTINGS
@given(st.lists(st.integers(0, 100), min_size=1, max_size=30), st.integers(1, 500))
def test_plan_shards_without_limits_in_play_is_one_shard(sizes: list[int], extra: int) -> None:
    plans = plan_shards(
        sizes, shard_bytes=sum(sizes) + extra, max_samples=len(sizes), prefix="s", suffix=".tar"
    )
    assert _ranges(plans) == [(0, len(sizes))]


# --- sample_order -------------------------------------------------------------------------------------


def test_sample_order_examples() -> None:
    assert sample_order(0) == []
    assert sample_order(0, seed=3) == []
    assert sample_order(5) == [0, 1, 2, 3, 4]
    assert sample_order(4, ["b", "a", "b", "a"]) == [1, 3, 0, 2]


def test_sample_order_rejects_partitions_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="partitions"):
        sample_order(3, ["a", "b"])


def _runs(values: list[str | None]) -> list[str | None]:
    """Distinct values in order of their runs: ``[a, a, b, a] -> [a, b, a]``."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


@SETTINGS
@given(
    st.integers(0, 60).flatmap(lambda n: st.lists(PARTS, min_size=n, max_size=n)), st.none() | st.integers()
)
def test_sample_order_properties(partitions: list[str | None], seed: int | None) -> None:
    n = len(partitions)
    order = sample_order(n, partitions, seed=seed)
    assert sorted(order) == list(range(n))  # a permutation

    # Partitions stay contiguous, and named partitions come in sorted order.
    runs = _runs([partitions[i] for i in order])
    assert len(runs) == len(set(runs))
    named = [r for r in runs if r is not None]
    assert named == sorted(named)

    # Within a partition: key order without a seed; with a seed, the same members in some order.
    unseeded = sample_order(n, partitions)
    assert [partitions[i] for i in order] == [partitions[i] for i in unseeded]
    for value in set(partitions):
        mine = [i for i in unseeded if partitions[i] == value]
        assert mine == sorted(mine)
        assert sorted(i for i in order if partitions[i] == value) == mine

    assert sample_order(n, partitions, seed=seed) == order  # deterministic


@SETTINGS
@given(st.integers(0, 200), st.none() | st.integers())
def test_sample_order_without_partitions(n: int, seed: int | None) -> None:
    order = sample_order(n, seed=seed)
    assert sorted(order) == list(range(n))
    if seed is None:
        assert order == list(range(n))
    assert order == sample_order(n, seed=seed)


@pytest.mark.parametrize(("a", "b"), [(0, 1), (1, 2), (7, 8), (0, 2**40)])
def test_sample_order_differs_between_seeds(a: int, b: int) -> None:
    n = 1000
    parts = ["p"] * 500 + ["q"] * 500
    assert sample_order(n, seed=a) != sample_order(n, seed=b)
    assert sample_order(n, seed=a) != list(range(n))
    # Both partitions are shuffled, not only the first one.
    order_a, order_b = sample_order(n, parts, seed=a), sample_order(n, parts, seed=b)
    assert order_a[:500] != order_b[:500] and order_a[500:] != order_b[500:]
    assert order_a[:500] != list(range(500)) and order_a[500:] != list(range(500, 1000))


# --- plan_row_groups ----------------------------------------------------------------------------------


def test_plan_row_groups_examples() -> None:
    assert plan_row_groups([], row_group_bytes=10) == []
    assert plan_row_groups([4, 4, 4], row_group_bytes=8) == [(0, 2), (2, 3)]
    assert plan_row_groups([4, 20, 4, 4], row_group_bytes=8) == [(0, 1), (1, 2), (2, 4)]
    assert plan_row_groups([0, 0, 0], row_group_bytes=1) == [(0, 3)]


@pytest.mark.parametrize("row_group_bytes", [0, -1])
def test_plan_row_groups_invalid(row_group_bytes: int) -> None:
    with pytest.raises(ValueError, match="row_group_bytes"):
        plan_row_groups([1], row_group_bytes=row_group_bytes)


@SETTINGS
@given(st.lists(st.integers(0, 1000), max_size=40), st.integers(1, 2500))
def test_plan_row_groups_properties(sizes: list[int], limit: int) -> None:
    groups = plan_row_groups(sizes, row_group_bytes=limit)
    bounds = [0, *(stop for _, stop in groups)]
    assert [start for start, _ in groups] == bounds[:-1]
    assert bounds[-1] == len(sizes)
    for start, stop in groups:
        assert stop > start
        assert sum(sizes[start:stop]) <= limit or stop - start == 1
        if stop < len(sizes):
            assert sum(sizes[start : stop + 1]) > limit  # greedy: the next sample did not fit
