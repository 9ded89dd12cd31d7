"""The mixture schedule (``core.mix``): the stated bound on proportions over every window, for 2-5 sources
and skewed weights, with and without a seeded phase and across schedule changes; counts and draw positions
agree with the choices; stop rules end where a simulation says; worker blocks deal positions as
``worker_position_array`` does, so the stream is the same for any number of workers on any rank."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.mix import (
    MAX_PERIOD,
    Pattern,
    Schedule,
    dealt,
    epoch_end,
    quotas,
    worker_blocks,
    worker_mask,
)
from fastload.core.sharding import worker_position_array

SETTINGS = settings(max_examples=60, deadline=None)
# weights as users write them: small integers, decimals, and skewed pairs like 0.99/0.01
WEIGHT = st.one_of(st.integers(0, 9), st.sampled_from([0.01, 0.05, 0.1, 0.25, 0.3, 0.7, 0.99]))
WEIGHTS = st.lists(WEIGHT, min_size=2, max_size=5).filter(any)


def window_excess(choices: np.ndarray, sources: int, expected: np.ndarray, n: int) -> float:
    """The largest ``|count - expected count|`` of any source over every window of ``n`` positions;
    ``expected``: each position's weights (positions x sources)."""
    onehot = np.zeros((len(choices) + 1, sources))
    onehot[np.arange(1, len(choices) + 1), choices] = 1
    counts = np.cumsum(onehot, axis=0)
    want = np.vstack([np.zeros(sources), np.cumsum(expected, axis=0)])
    return float(np.abs((counts[n:] - counts[:-n]) - (want[n:] - want[:-n])).max())


@SETTINGS
@given(WEIGHTS)
def test_every_prefix_of_a_period_lags_less_than_one(weights: list[float]) -> None:
    p = Pattern.of(weights)
    w = np.asarray(p.quota) / p.period
    assert np.isclose(w, np.asarray(weights) / sum(weights)).all()  # exact: no rounding for such weights
    counts = np.zeros(len(weights))
    for t, s in enumerate(p.choice):
        counts[s] += 1
        assert np.abs(w * (t + 1) - counts).max() < 1
    assert counts.tolist() == list(p.quota)


@SETTINGS
@given(WEIGHTS, st.integers(0, 2**31), st.integers(1, 60))
def test_any_window_of_one_segment_is_within_two(weights: list[float], seed: int, n: int) -> None:
    sched = Schedule([0], [weights], seed=seed, epoch=3)
    span = 3 * sched.patterns[0].period + 2 * n
    choices = sched.choices(np.arange(span))
    w = np.asarray(weights, dtype=float) / sum(weights)
    assert window_excess(choices, len(weights), np.tile(w, (span, 1)), min(n, span)) < 2


@SETTINGS
@given(st.lists(WEIGHTS.filter(lambda w: len(w) == 3), min_size=2, max_size=4), st.integers(1, 40))
def test_a_window_touching_g_segments_is_within_2g(segments: list[list[float]], n: int) -> None:
    starts = [0] + [7 + 23 * i for i in range(len(segments) - 1)]
    sched = Schedule(starts, segments, seed=11, epoch=0)
    span = starts[-1] + 100
    t = np.arange(span)
    choices = sched.choices(t)
    seg = np.searchsorted(starts, t, side="right") - 1
    expected = np.asarray([np.asarray(w, float) / sum(w) for w in segments])[seg]
    touched = max(len(set(seg[a : a + n])) for a in range(span - n + 1))
    assert window_excess(choices, 3, expected, n) < 2 * touched


def test_skewed_weights_give_the_rare_source_its_exact_share() -> None:
    sched = Schedule([0], [[0.99, 0.01]], seed=None, epoch=0)
    choices = sched.choices(np.arange(1000))
    assert np.flatnonzero(choices == 1).tolist() == [99 + 100 * i for i in range(10)]  # at its deadline
    assert window_excess(choices, 2, np.tile([0.99, 0.01], (1000, 1)), 100) < 2


def test_weights_are_exact_fractions_or_rounded_finely() -> None:
    assert quotas([0.7, 0.2, 0.1]) == (7, 2, 1)
    assert quotas([1, 1, 1]) == (1, 1, 1)
    assert quotas([1 / 3, 2 / 3]) == (1, 2)
    odd = quotas([1, 1e-7 + 1 / 65537])
    assert sum(odd) <= MAX_PERIOD
    for bad in ([0, 0], [], [1, -1], [float("nan"), 1]):
        with pytest.raises(ValueError, match="weights"):
            quotas(bad)


@SETTINGS
@given(st.lists(WEIGHTS.filter(lambda w: len(w) == 2), min_size=1, max_size=3), st.integers(0, 99))
def test_counts_and_positions_invert_the_choices(segments: list[list[float]], seed: int) -> None:
    starts = [0, 13, 40][: len(segments)]
    sched = Schedule(starts, segments, seed=seed, epoch=1)
    choices = sched.choices(np.arange(200))
    for t in (0, 1, 12, 13, 14, 39, 40, 199):
        assert sched.counts(t).tolist() == np.bincount(choices[:t], minlength=2).tolist()
    for s in range(2):
        where = np.flatnonzero(choices == s)
        got = sched.positions(s, np.arange(len(where)))
        assert got.tolist() == where.tolist()
        if segments[-1][s] == 0:  # never drawn again
            assert sched.position(s, len(where) + 5) is None


@SETTINGS
@given(WEIGHTS.filter(lambda w: all(w)), st.lists(st.integers(1, 12), min_size=5, max_size=5), st.booleans())
def test_stop_rules_end_where_a_simulation_does(weights: list[float], sizes: list[int], seeded: bool) -> None:
    sizes = sizes[: len(weights)]
    sched = Schedule([0], [weights], seed=5 if seeded else None, epoch=0)
    choices = sched.choices(np.arange(40_000))
    where = [np.flatnonzero(choices == s) for s in range(len(weights))]  # each source's draws, in order
    first = min(int(w[n]) for w, n in zip(where, sizes, strict=True))  # a draw past a source's samples
    last = max(int(w[n - 1]) for w, n in zip(where, sizes, strict=True)) + 1  # every sample drawn
    assert epoch_end(sched, sizes, [0] * len(sizes), "first_exhausted") == first
    assert epoch_end(sched, sizes, [0] * len(sizes), "all_exhausted") == last
    assert epoch_end(sched, sizes, [0] * len(sizes), "never") is None


def test_all_exhausted_refuses_a_source_whose_weight_drops_to_zero() -> None:
    sched = Schedule([0, 10], [[1, 1], [1, 0]], seed=None, epoch=0)
    with pytest.raises(ValueError, match="source 1"):
        epoch_end(sched, [3, 8], [0, 0], "all_exhausted")
    assert epoch_end(sched, [3, 8], [0, 0], "first_exhausted") == 6  # source 0 needs a fourth sample at 6


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_workers_deal_the_same_stream_on_every_rank(world: int, workers: int) -> None:
    """Choices depend on the position alone (every rank the same), and each worker's positions are the
    chunks ``worker_position_array`` deals, so the loop sees positions in order for any worker count."""
    sched = Schedule([0, 30], [[0.99, 0.01], [0.5, 0.2, 0.3][:2]], seed=world, epoch=0)
    start, stop, chunk = 5, 203, 4
    streams = []
    for w in range(workers):
        got = np.concatenate(
            list(worker_blocks(start, stop, worker=w, workers=workers, chunk=chunk, block=8))
        )
        want = worker_position_array(stop, worker=w, workers=workers, chunk=chunk, start=start)
        assert got.tolist() == want.tolist()
        assert worker_mask(got, start=start, worker=w, workers=workers, chunk=chunk).all()
        streams.append(got)
    for w in range(workers):
        assert dealt(stop - start, w, workers, chunk) == len(streams[w])
    merged = sorted(np.concatenate(streams).tolist())
    assert merged == list(range(start, stop))
    endless = worker_blocks(start, None, worker=0, workers=workers, chunk=chunk, block=8)
    assert next(iter(endless)).tolist() == streams[0][:8].tolist()
    later = worker_blocks(start, stop, worker=0, workers=workers, chunk=chunk, skip=5, block=8)
    assert np.concatenate(list(later)).tolist() == streams[0][5:].tolist()
    assert (sched.choices(np.asarray(merged)) == sched.choices(np.arange(start, stop))).all()


def test_fractions_survive_float_input() -> None:
    assert Fraction(Pattern.of([0.1, 0.2, 0.7]).quota[0], 10) == Fraction(1, 10)
