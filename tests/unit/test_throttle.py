"""AIMD concurrency: halve on throttling (once per burst), grow back by one per ``limit`` successes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.throttle import Aimd

SETTINGS = settings(max_examples=300, deadline=None)


def test_starts_at_max() -> None:
    aimd = Aimd(max_limit=16)
    assert aimd.allowed == 16
    assert aimd.limit == 16.0
    assert Aimd(max_limit=1).allowed == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_limit": 0},
        {"max_limit": 4, "min_limit": 0},
        {"max_limit": 4, "min_limit": 5},
        {"max_limit": 4, "decrease_factor": 0.0},
        {"max_limit": 4, "decrease_factor": 1.0},
        {"max_limit": 4, "decrease_factor": 1.5},
    ],
)
def test_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Aimd(**kwargs)  # type: ignore[arg-type]


def test_throttle_halves_down_to_min() -> None:
    aimd = Aimd(max_limit=16)  # cooldown 0.5 s
    assert [aimd.on_throttle(t) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)] == [8, 4, 2, 1, 1, 1, 1]
    assert aimd.allowed == 1

    aimd = Aimd(max_limit=16, min_limit=3)
    assert [aimd.on_throttle(t) for t in (0.0, 1.0, 2.0, 3.0)] == [8, 4, 3, 3]
    assert aimd.limit == 3.0

    aimd = Aimd(max_limit=100, decrease_factor=0.75)
    assert aimd.on_throttle(0.0) == 75


def test_throttles_within_cooldown_count_once() -> None:
    aimd = Aimd(max_limit=64, cooldown_s=0.5)
    # A burst: 20 throttles in the 0.49 s after the first count as one.
    assert aimd.on_throttle(10.0) == 32
    for i in range(20):
        assert aimd.on_throttle(10.0 + i * 0.49 / 19) == 32
    # cooldown_s after the decrease, the next throttle is a new signal.
    assert aimd.on_throttle(10.5) == 16
    assert aimd.on_throttle(10.6) == 16
    assert aimd.on_throttle(11.1) == 8


def test_cooldown_zero_counts_every_throttle() -> None:
    aimd = Aimd(max_limit=64, cooldown_s=0.0)
    assert [aimd.on_throttle(1.0) for _ in range(4)] == [32, 16, 8, 4]


def test_successes_grow_by_about_one_per_limit() -> None:
    aimd = Aimd(max_limit=16)
    aimd.on_throttle(0.0)
    assert aimd.allowed == 8
    # From 8 to 9 takes about 8 successes (each adds 1/limit, a little less than 1/8 after the first).
    successes = 0
    while aimd.allowed < 9:
        aimd.on_success()
        successes += 1
    assert 8 <= successes <= 9
    # From 8 all the way to 16: about 8 + 9 + ... + 15 = 92, give or take one per step.
    while aimd.allowed < 16:
        aimd.on_success()
        successes += 1
    assert 84 <= successes <= 100
    # Never above max, however many more successes.
    for _ in range(1_000):
        assert aimd.on_success() == 16
    assert aimd.limit == 16.0


def test_growth_from_min() -> None:
    aimd = Aimd(max_limit=4)
    for t in (0.0, 1.0, 2.0):
        aimd.on_throttle(t)
    assert aimd.allowed == 1
    assert aimd.on_success() == 2  # 1 + 1/1
    assert aimd.on_success() == 2  # 2.5
    assert aimd.on_success() == 2  # 2.9
    assert aimd.on_success() == 3  # 3.24...


def test_no_growth_past_max_from_the_start() -> None:
    aimd = Aimd(max_limit=5)
    for _ in range(100):
        assert aimd.on_success() == 5
    assert aimd.limit == 5.0


EVENTS = st.lists(
    st.tuples(st.sampled_from(["success", "throttle"]), st.floats(0, 2, allow_nan=False)),
    max_size=300,
)


@SETTINGS
@given(
    max_limit=st.integers(1, 256),
    min_frac=st.floats(0, 1),
    factor=st.floats(0.01, 0.99),
    cooldown=st.floats(0, 3, allow_nan=False),
    events=EVENTS,
)
def test_limit_stays_within_bounds(
    max_limit: int, min_frac: float, factor: float, cooldown: float, events: list[tuple[str, float]]
) -> None:
    min_limit = max(1, round(max_limit * min_frac))
    aimd = Aimd(max_limit=max_limit, min_limit=min_limit, decrease_factor=factor, cooldown_s=cooldown)
    now = 0.0
    for kind, step in events:
        now += step  # a monotonic clock
        before = aimd.limit
        allowed = aimd.on_success() if kind == "success" else aimd.on_throttle(now)
        assert min_limit <= aimd.limit <= max_limit
        assert min_limit <= allowed <= max_limit
        assert allowed == aimd.allowed
        if kind == "success":
            assert aimd.limit >= before
        else:
            assert aimd.limit <= before
