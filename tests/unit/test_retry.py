"""Retry policy: which faults are retried, full-jitter backoff, attempt and deadline bounds, storms."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.retry import RETRYABLE, Fault, RetryPolicy, classify_status

SETTINGS = settings(max_examples=300, deadline=None)
DEFAULT = RetryPolicy()


# --- classify_status ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "fault"),
    [
        (503, "SlowDown", Fault.THROTTLE),
        (503, None, Fault.THROTTLE),
        (503, "ServiceUnavailable", Fault.THROTTLE),
        (429, None, Fault.THROTTLE),
        (429, "TooManyRequests", Fault.THROTTLE),
        (400, "Throttling", Fault.THROTTLE),
        (500, "InternalError", Fault.SERVER),
        (500, None, Fault.SERVER),
        (502, None, Fault.SERVER),
        (504, None, Fault.SERVER),
        (400, "RequestTimeout", Fault.TIMEOUT),
        (412, None, Fault.CHANGED),
        (412, "PreconditionFailed", Fault.CHANGED),
        (404, "NoSuchKey", Fault.NOT_FOUND),
        (404, "NoSuchBucket", Fault.NOT_FOUND),
        (404, None, Fault.NOT_FOUND),
        (403, None, Fault.DENIED),
        (403, "AccessDenied", Fault.DENIED),
        (401, None, Fault.DENIED),
        (400, "InvalidArgument", Fault.CLIENT),
        (400, None, Fault.CLIENT),
        (416, "InvalidRange", Fault.CLIENT),
        (405, None, Fault.CLIENT),
    ],
)
def test_classify_status(status: int, code: str | None, fault: Fault) -> None:
    assert classify_status(status, code) is fault


def test_retryable_faults() -> None:
    retried = {
        Fault.THROTTLE,
        Fault.SERVER,
        Fault.TIMEOUT,
        Fault.CONNECTION,
        Fault.UNREACHABLE,
        Fault.SHORT_BODY,
        Fault.BAD_RANGE,
    }
    assert retried == RETRYABLE
    for fault in (Fault.CHANGED, Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT):
        assert fault not in RETRYABLE


# --- RetryPolicy: validation and backoff -------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_backoff_s": -0.1},
        {"base_backoff_s": 2.0, "max_backoff_s": 1.0},
        {"deadline_s": 0.0},
        {"deadline_s": -1.0},
        {"unreachable_deadline_s": 0.0},
    ],
)
def test_policy_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def _cap(policy: RetryPolicy, attempt: int) -> float:
    return min(policy.max_backoff_s, policy.base_backoff_s * 2.0 ** (attempt - 1))


@SETTINGS
@given(
    base=st.floats(0, 2, allow_nan=False),
    spread=st.floats(0, 30, allow_nan=False),
    attempt=st.integers(1, 200),
    seed=st.integers(0, 2**32 - 1),
)
def test_backoff_within_full_jitter_bounds(base: float, spread: float, attempt: int, seed: int) -> None:
    policy = RetryPolicy(base_backoff_s=base, max_backoff_s=base + spread)
    rng = random.Random(seed)
    for _ in range(5):
        delay = policy.backoff(attempt, rng)
        assert 0.0 <= delay <= _cap(policy, attempt) * (1 + 1e-12)


def test_backoff_caps_of_the_default_policy() -> None:
    # 50 ms doubling: 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, then the 4 s ceiling.
    expected = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 4.0, 4.0, 4.0]
    rng = random.Random(7)
    for attempt, cap in enumerate(expected, start=1):
        draws = [DEFAULT.backoff(attempt, rng) for _ in range(2_000)]
        assert min(draws) >= 0.0 and max(draws) <= cap
        # Full jitter: the draws fill [0, cap], they do not cluster at the cap (nor at a fixed fraction).
        assert max(draws) > 0.98 * cap
        assert min(draws) < 0.02 * cap
    assert DEFAULT.backoff(1000, rng) <= 4.0


@pytest.mark.parametrize(("attempt", "cap"), [(1, 0.05), (3, 0.2), (6, 1.6), (12, 4.0)])
def test_backoff_mean_is_half_the_cap(attempt: int, cap: float) -> None:
    rng = random.Random(12345)
    draws = [DEFAULT.backoff(attempt, rng) for _ in range(20_000)]
    # Uniform on [0, cap]: mean cap/2, standard error cap/sqrt(12 * 20000) ~ 0.002 cap.
    assert statistics.fmean(draws) == pytest.approx(cap / 2, rel=0.03)
    below_quarter = sum(d < cap / 4 for d in draws) / len(draws)
    assert below_quarter == pytest.approx(0.25, abs=0.02)


# --- RetryPolicy.decide ------------------------------------------------------------------------------


class TopRng(random.Random):
    """Always draws the top of the interval, so the delay equals the backoff cap."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.mark.parametrize("fault", [Fault.CHANGED, Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT])
def test_decide_gives_up_at_once_on_non_retryable(fault: Fault) -> None:
    assert DEFAULT.decide(fault, 1, 0.0, random.Random(0)) is None


@pytest.mark.parametrize("fault", [f for f in Fault if f in RETRYABLE])
def test_decide_retries_retryable(fault: Fault) -> None:
    delay = DEFAULT.decide(fault, 1, 0.0, random.Random(0))
    assert delay is not None and 0.0 <= delay <= 0.05


def test_decide_stops_at_max_attempts() -> None:
    policy = RetryPolicy(max_attempts=5, deadline_s=1e9)
    rng = random.Random(0)
    for attempt in range(1, 5):
        assert policy.decide(Fault.THROTTLE, attempt, 0.0, rng) is not None
    assert policy.decide(Fault.THROTTLE, 5, 0.0, rng) is None
    assert policy.decide(Fault.THROTTLE, 6, 0.0, rng) is None
    assert RetryPolicy(max_attempts=1).decide(Fault.SERVER, 1, 0.0, rng) is None


def test_decide_stops_when_the_delay_would_cross_the_deadline() -> None:
    policy = RetryPolicy(base_backoff_s=1.0, max_backoff_s=1.0, deadline_s=10.0, max_attempts=100)
    rng = TopRng()
    assert policy.decide(Fault.THROTTLE, 3, 8.5, rng) == 1.0  # 8.5 + 1 < 10
    assert policy.decide(Fault.THROTTLE, 3, 9.0, rng) is None  # would land exactly on the deadline
    assert policy.decide(Fault.THROTTLE, 3, 9.5, rng) is None
    assert policy.decide(Fault.THROTTLE, 3, 11.0, rng) is None  # already past it


@SETTINGS
@given(
    fault=st.sampled_from(list(Fault)),
    attempt=st.integers(1, 50),
    elapsed=st.floats(0, 200, allow_nan=False),
    seed=st.integers(0, 2**32 - 1),
)
def test_decide_bounds(fault: Fault, attempt: int, elapsed: float, seed: int) -> None:
    delay = DEFAULT.decide(fault, attempt, elapsed, random.Random(seed))
    if fault not in RETRYABLE or attempt >= DEFAULT.max_attempts or elapsed >= DEFAULT.deadline_s:
        assert delay is None
    if delay is not None:
        assert 0.0 <= delay <= _cap(DEFAULT, attempt)
        assert elapsed + delay < DEFAULT.deadline_s


# --- storms: a fake clock runs the loop --------------------------------------------------------------

ATTEMPT_S = 0.02  # every attempt takes 20 ms before its 503 (or its success) arrives


def ride_storm(policy: RetryPolicy, storm_s: float, seed: int) -> tuple[bool, int, float]:
    """(succeeded, attempts, time at the end) for one request started at t=0 into a 503 storm that fails
    every attempt starting before ``storm_s``."""
    rng = random.Random(seed)
    now = 0.0
    attempts = 0
    while True:
        attempts += 1
        started = now
        now += ATTEMPT_S
        if started >= storm_s:
            return True, attempts, now
        delay = policy.decide(Fault.THROTTLE, attempts, now, rng)
        if delay is None:
            return False, attempts, now
        now += delay


@pytest.mark.parametrize("storm_s", [5.0, 10.0])
def test_default_policy_rides_out_a_storm(storm_s: float) -> None:
    for seed in range(200):
        ok, attempts, end = ride_storm(DEFAULT, storm_s, seed)
        assert ok, f"seed {seed}: gave up after {attempts} attempts at t={end:.2f}s in a {storm_s}s storm"
        # It gets through on the first attempt after the storm: at most one backoff past the end.
        assert storm_s < end <= storm_s + DEFAULT.max_backoff_s + 2 * ATTEMPT_S
        assert attempts <= DEFAULT.max_attempts


def test_endless_storm_default_policy_gives_up_in_time() -> None:
    for seed in range(200):
        ok, attempts, end = ride_storm(DEFAULT, float("inf"), seed)
        assert not ok
        assert attempts <= DEFAULT.max_attempts
        assert end < DEFAULT.deadline_s + ATTEMPT_S


@pytest.mark.parametrize("deadline_s", [3.0, 10.0, 30.0])
def test_storm_longer_than_the_deadline_gives_up_by_the_deadline(deadline_s: float) -> None:
    policy = RetryPolicy(max_attempts=10_000, deadline_s=deadline_s)
    for seed in range(200):
        ok, attempts, end = ride_storm(policy, deadline_s * 2, seed)
        assert not ok
        assert attempts < policy.max_attempts  # the deadline, not the count, stopped it
        assert end < deadline_s + ATTEMPT_S
        # ...and it did not stop much earlier than it had to: the next wait would have crossed the deadline.
        assert end >= deadline_s - policy.max_backoff_s


def test_an_endpoint_that_never_answered_gets_seconds_not_the_full_deadline() -> None:
    """Issue 28 item 9: refused connections to an endpoint that never answered are retried only for
    ``unreachable_deadline_s``; one that answered before (a restart) keeps the whole budget, as do other
    faults."""
    policy = RetryPolicy(unreachable_deadline_s=3.0)
    rng = random.Random(0)
    assert policy.decide(Fault.UNREACHABLE, 1, 0.0, rng, answered=False) is not None  # a server starting
    assert policy.decide(Fault.UNREACHABLE, 2, 2.99, random.Random(0), answered=False) is None
    for attempt in range(1, 6):
        assert policy.decide(Fault.UNREACHABLE, attempt, 10.0, rng, answered=True) is not None
    assert policy.decide(Fault.CONNECTION, 2, 10.0, rng, answered=False) is not None
    assert policy.decide(Fault.THROTTLE, 2, 10.0, rng, answered=False) is not None
