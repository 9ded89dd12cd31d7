"""The pure tail-tolerance policy (``fastload.core.hedge``): latency model, bounded deadlines, lag, budget."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.hedge import (
    PIECE_BYTES,
    STARVED_MIN_S,
    STRANDED_RATIO,
    Flight,
    HedgePolicy,
    Lag,
    LatencyModel,
    Patience,
    Starvation,
    Verdict,
    deadlines,
    decide,
    lag,
    quantile,
    size_class,
    split_range,
    stranded,
)
from fastload.core.ranges import ByteRange

MIB = 1 << 20


def warm_model(
    first_byte_s: float = 0.02, rate: float = 50e6, n: int = 64, nbytes: int = 4 * MIB
) -> LatencyModel:
    model = LatencyModel(min_samples=16)
    rng = random.Random(3)
    for _ in range(n):
        fb = first_byte_s * rng.uniform(0.8, 1.2)
        model.observe(nbytes, fb, fb + nbytes / (rate * rng.uniform(0.8, 1.2)))
    return model


def test_quantile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50 and quantile(values, 0.99) == 99 and quantile(values, 1.0) == 100
    assert quantile(values, 0.0) == 1 and quantile([7.0], 0.95) == 7


def test_size_classes_are_powers_of_four() -> None:
    assert size_class(0) == size_class(1) == 0
    assert size_class(4 * MIB) == size_class(4 * MIB + 1) == size_class(16 * MIB - 1) != size_class(16 * MIB)
    assert size_class(MIB) < size_class(4 * MIB)


def test_a_cold_model_gives_the_cold_deadline() -> None:
    policy = HedgePolicy(floor_s=0.1, ceiling_s=10.0, cold_factor=10.0)
    limits = deadlines(LatencyModel(), policy)
    assert limits.first_byte_s == limits.progress_s == limits.completion_s(64 * MIB) == pytest.approx(1.0)
    assert deadlines(LatencyModel(), HedgePolicy(floor_s=0.5, ceiling_s=2.0)).first_byte_s == 2.0  # ceiling


def test_a_warm_model_predicts_from_first_byte_and_throughput() -> None:
    model = warm_model(first_byte_s=0.02, rate=50e6)
    predicted = model.predict_s(4 * MIB)
    assert predicted is not None and 0.02 + 4 * MIB / 60e6 < predicted < 0.025 + 4 * MIB / 40e6
    assert model.first_byte_s(0.5) == pytest.approx(0.02, rel=0.25)


def test_deadlines_adapt_between_floor_and_ceiling() -> None:
    policy = HedgePolicy(floor_s=0.1, ceiling_s=10.0, multiplier=4.0)
    fast = deadlines(warm_model(first_byte_s=0.05, rate=50e6), policy)
    slow = deadlines(warm_model(first_byte_s=0.5, rate=2e6), policy)
    assert fast.first_byte_s == pytest.approx(4 * 0.06, rel=0.05)  # 4 x p99 of 0.04-0.06
    assert slow.first_byte_s > fast.first_byte_s and slow.progress_s > fast.progress_s
    assert slow.completion_s(4 * MIB) > fast.completion_s(4 * MIB) > fast.completion_s(256 << 10)
    glacial = deadlines(warm_model(first_byte_s=30.0, rate=1e3), policy)
    assert glacial.first_byte_s == glacial.progress_s == glacial.completion_s(MIB) == 10.0  # the ceiling


@settings(max_examples=200, deadline=None)
@given(
    floor=st.floats(0.01, 5.0),
    span=st.floats(0.0, 20.0),
    samples=st.lists(
        st.tuples(st.integers(0, 64 * MIB), st.floats(0.0, 50.0), st.floats(0.0, 50.0)), max_size=80
    ),
    nbytes=st.integers(0, 1 << 34),
)
def test_deadlines_stay_within_the_bounds(
    floor: float, span: float, samples: list[tuple[int, float, float]], nbytes: int
) -> None:
    policy = HedgePolicy(floor_s=floor, ceiling_s=floor + span)
    model = LatencyModel(min_samples=4)
    for size, fb, body in samples:
        model.observe(size, fb, fb + body)
    limits = deadlines(model, policy)
    for value in (limits.first_byte_s, limits.progress_s, limits.completion_s(nbytes)):
        assert floor <= value <= floor + span


def test_the_progress_deadline_follows_the_longest_waits_for_body_pieces() -> None:
    policy = HedgePolicy(floor_s=0.01, ceiling_s=10.0, multiplier=4.0)
    model = warm_model()
    by_rate = deadlines(model, policy).progress_s  # no waits known yet: one piece at the slow rate
    assert by_rate == pytest.approx(4 * PIECE_BYTES / model.rate(PIECE_BYTES, 0.05), rel=1e-6)  # type: ignore[operator]
    for i in range(100):
        model.observe(4 * MIB, 0.02, 0.2, max_gap_s=0.3 if i == 99 else 0.05)
    assert deadlines(model, policy).progress_s == pytest.approx(4 * 0.05)  # p99 of the waits, x4
    for _ in range(5):
        model.observe(4 * MIB, 0.02, 0.2, max_gap_s=0.3)  # a busier endpoint: the deadline grows
    assert deadlines(model, policy).progress_s == pytest.approx(4 * 0.3)


def test_lag_says_why() -> None:
    limits = deadlines(LatencyModel(), HedgePolicy(floor_s=0.1, ceiling_s=10.0))  # cold: 1 s
    waiting = Flight(sent_at=0.0, head_at=None, progress_at=0.0, nbytes=MIB)
    assert lag(waiting, 0.9, limits) is None and lag(waiting, 1.1, limits) is Lag.FIRST_BYTE
    flowing = Flight(sent_at=0.0, head_at=0.05, progress_at=0.95, nbytes=MIB)
    assert lag(flowing, 1.0, limits) is None
    assert lag(flowing, 2.0, limits) is Lag.STALLED
    creeping = Flight(sent_at=0.0, head_at=0.05, progress_at=1.3, nbytes=MIB)
    assert lag(creeping, 1.4, limits) is Lag.SLOW  # still moving, but past its size's completion deadline


def test_decide_holds_back_while_throttled_then_hedges() -> None:
    policy = HedgePolicy(throttle_quiet_s=2.0)
    kw = {"requests": 1000, "hedges": 0, "hedges_of_this": 0}
    assert decide(policy, now=10.0, last_throttle_at=9.0, **kw) is Verdict.THROTTLED
    assert decide(policy, now=12.5, last_throttle_at=9.0, **kw) is Verdict.HEDGE
    assert decide(policy, now=10.0, last_throttle_at=None, **kw) is Verdict.HEDGE


def test_decide_caps_hedges_per_request() -> None:
    policy = HedgePolicy(max_hedges=2)
    assert (
        decide(policy, now=0, last_throttle_at=None, requests=100, hedges=0, hedges_of_this=1)
        is Verdict.HEDGE
    )
    assert (
        decide(policy, now=0, last_throttle_at=None, requests=100, hedges=0, hedges_of_this=2)
        is Verdict.ENOUGH
    )


@settings(max_examples=100, deadline=None)
@given(
    fraction=st.floats(0.0, 0.2),
    burst=st.integers(0, 5),
    lagging=st.lists(st.booleans(), min_size=1, max_size=2000),
)
def test_the_budget_bounds_hedges_by_the_fraction_of_requests(
    fraction: float, burst: int, lagging: list[bool]
) -> None:
    """Whatever lags, hedges never pass ``burst + max_fraction x requests`` at any point."""
    policy = HedgePolicy(max_fraction=fraction, burst=burst)
    hedges = 0
    for requests, slow in enumerate(lagging, start=1):
        if slow:
            verdict = decide(
                policy, now=0.0, last_throttle_at=None, requests=requests, hedges=hedges, hedges_of_this=0
            )
            hedges += verdict is Verdict.HEDGE
        assert hedges <= burst + fraction * requests
    if fraction >= 0.05 and all(lagging[:100]) and len(lagging) >= 100:
        assert hedges >= 5  # the budget is spent, not hoarded


def test_policy_validates_its_bounds() -> None:
    with pytest.raises(ValueError, match="floor_s"):
        HedgePolicy(floor_s=5.0, ceiling_s=1.0)
    with pytest.raises(ValueError, match="max_fraction"):
        HedgePolicy(max_fraction=1.5)
    assert not HedgePolicy(max_fraction=0.0).enabled
    assert PIECE_BYTES >= 64 << 10


def test_patience_stretches_deadlines_after_lost_hedges_and_shrinks_after_won_ones() -> None:
    patience = Patience(grow=2.0, shrink=0.5, most=8.0)
    for want in (2.0, 4.0, 8.0, 8.0):  # hedges of slow transfers the original GETs beat: sent too early
        patience.hedge_ended(Lag.SLOW, won=False)
        assert patience.factors[Lag.SLOW] == want
    assert patience.factors[Lag.FIRST_BYTE] == patience.factors[Lag.STALLED] == 1.0  # by kind
    patience.hedge_ended(Lag.SLOW, won=True)
    assert patience.factors[Lag.SLOW] == 4.0
    for _ in range(5):
        patience.hedge_ended(Lag.SLOW, won=True)
        patience.hedge_ended(Lag.STALLED, won=True)
    assert set(patience.factors.values()) == {1.0}  # never below the model's own deadlines
    with pytest.raises(ValueError):
        Patience(shrink=0.0)


def test_a_stretch_scales_each_kind_of_deadline_within_the_ceiling() -> None:
    policy = HedgePolicy(floor_s=0.1, ceiling_s=10.0, multiplier=3.0)
    model = warm_model(first_byte_s=0.05, rate=50e6)
    plain = deadlines(model, policy)
    stretched = deadlines(model, policy, {Lag.FIRST_BYTE: 4.0, Lag.STALLED: 2.0, Lag.SLOW: 3.0})
    assert stretched.first_byte_s == pytest.approx(4 * plain.first_byte_s)
    assert stretched.progress_s == pytest.approx(2 * plain.progress_s)
    assert stretched.completion_s(4 * MIB) == pytest.approx(3 * plain.completion_s(4 * MIB))
    assert deadlines(model, policy, {Lag.SLOW: 5.0}).first_byte_s == plain.first_byte_s
    capped = deadlines(warm_model(first_byte_s=2.0, rate=1e5), policy, dict.fromkeys(Lag, 8.0))
    assert capped.first_byte_s == capped.progress_s == capped.completion_s(MIB) == 10.0


def spread_model(n: int = 100) -> LatencyModel:
    """First bytes mostly 20 ms with a 5% tail at 300 ms (a busy endpoint): p50 20 ms, p99 300 ms."""
    model = LatencyModel(min_samples=16)
    for i in range(n):
        fb = 0.3 if i % 20 == 0 else 0.02
        model.observe(4 * MIB, fb, fb + 4 * MIB / 50e6)
    return model


def test_a_stranded_request_gets_the_deadline_of_the_median_first_byte() -> None:
    policy = HedgePolicy(floor_s=0.01, ceiling_s=10.0, multiplier=3.0)
    limits = deadlines(spread_model(), policy)
    assert limits.first_byte_s == pytest.approx(0.9) and limits.stranded_s == pytest.approx(0.06)
    waiting = Flight(sent_at=0.0, head_at=None, progress_at=0.0, nbytes=4 * MIB)
    left = Flight(sent_at=0.0, head_at=None, progress_at=0.0, nbytes=4 * MIB, stranded=True)
    assert lag(waiting, 0.5, limits) is None and lag(left, 0.05, limits) is None
    assert lag(left, 0.07, limits) is Lag.STRANDED
    assert lag(left, 1.0, limits) is lag(waiting, 1.0, limits) is Lag.FIRST_BYTE
    answered = Flight(sent_at=0.0, head_at=0.01, progress_at=0.249, nbytes=4 * MIB, stranded=True)
    assert lag(answered, 0.25, limits) is None  # a head came: the rule is about silent requests only
    # patience of its own kind: lost stranded hedges stretch only this deadline
    stretched = deadlines(spread_model(), policy, {Lag.STRANDED: 4.0})
    assert stretched.stranded_s == pytest.approx(0.24) and stretched.first_byte_s == limits.first_byte_s
    assert deadlines(LatencyModel(), policy).stranded_s is None  # cold: no evidence of what is normal


def test_stranded_needs_finished_siblings_and_no_answered_one() -> None:
    assert stranded(finished=STRANDED_RATIO, silent=1, answered=0)
    assert not stranded(finished=STRANDED_RATIO - 1, silent=1, answered=0)  # too little evidence
    assert not stranded(finished=15, silent=1, answered=1)  # its reader still receives: it is busy
    # most of a reader's GETs silent at once: the endpoint or the machine stalls, not one connection
    assert not stranded(finished=1, silent=8, answered=0)
    assert stranded(finished=14, silent=2, answered=0)
    assert not stranded(finished=5, silent=0, answered=0)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 1 << 40), length=st.integers(1, 64 * MIB), pieces=st.integers(1, 16))
def test_split_ranges_cover_the_range_exactly_once(start: int, length: int, pieces: int) -> None:
    whole = ByteRange(start, start + length)
    parts = split_range(whole, pieces)
    assert len(parts) == min(pieces, length)
    assert parts[0].start == whole.start and parts[-1].end == whole.end
    assert all(a.end == b.start for a, b in pairwise(parts))
    sizes = {p.length for p in parts}
    assert max(sizes) - min(sizes) <= 1


def test_a_silent_request_is_hedged_in_pieces_of_about_one_first_byte_of_transfer() -> None:
    policy = HedgePolicy(floor_s=0.01, max_split=4, split_min_bytes=MIB)
    s3_like = deadlines(warm_model(first_byte_s=0.025, rate=90e6), policy)  # ~2.25 MB per first byte
    assert s3_like.pieces(4 * MIB) == 2 and s3_like.pieces(8 * MIB) == 4 and s3_like.pieces(64 * MIB) == 4
    assert s3_like.pieces(MIB) == 1 and s3_like.pieces(MIB + MIB // 2) == 1  # pieces of >= 1 MiB
    slow_start = deadlines(warm_model(first_byte_s=0.2, rate=50e6), policy)  # 10 MB per first byte
    assert slow_start.pieces(8 * MIB) == 1  # splitting would only add first-byte waits
    assert deadlines(LatencyModel(), policy).pieces(64 * MIB) == 1  # cold: what one GET takes is unknown
    assert deadlines(warm_model(), HedgePolicy(max_split=1)).pieces(64 * MIB) == 1
    with pytest.raises(ValueError, match="max_split"):
        HedgePolicy(max_split=0)


def test_starvation_excuses_only_the_time_the_process_did_not_run() -> None:
    starved = Starvation(keep=2)
    starved.slept(0.1, began=1.0, woke=1.1 + STARVED_MIN_S / 2)  # on time, within the slack
    assert starved.total == 0 and starved.since(0.0) == 0
    starved.slept(0.1, began=2.0, woke=2.5 + STARVED_MIN_S)  # 0.4 s off the CPU, beyond the slack
    assert starved.since(1.9) == pytest.approx(0.4) and starved.since(2.5 + STARVED_MIN_S) == 0
    policy = HedgePolicy(floor_s=0.1, ceiling_s=5.0, max_fraction=0.05)
    limits = deadlines(LatencyModel(), policy)  # cold: 10x the floor, 1 s
    waiting = Flight(sent_at=1.8, head_at=None, progress_at=1.8, nbytes=MIB)
    assert lag(waiting, 3.0, limits) is Lag.FIRST_BYTE  # 1.2 s of waiting ...
    assert lag(starved.excuse(waiting), 3.0, limits) is None  # ... of which 0.4 s the process was not running
    assert lag(starved.excuse(waiting), 3.3, limits) is Lag.FIRST_BYTE
    flowing = Flight(sent_at=1.0, head_at=1.01, progress_at=2.6, nbytes=MIB)  # progress after the wake-up
    assert starved.excuse(flowing) == Flight(1.4, 1.01, 2.6, MIB)
    for i in range(6):  # the oldest wake-ups are forgotten (keep=2), the recent ones stay exact
        starved.slept(0.1, began=10.0 + i, woke=10.3 + STARVED_MIN_S + i)
    assert starved.total == pytest.approx(0.4 + 6 * 0.2)
    assert starved.since(13.5) == pytest.approx(0.4) and starved.since(14.5) == pytest.approx(0.2)
    assert starved.since(16.0) == 0
