"""The serve ledger (``fastload.core.serveplan``): for any interleaving of feeders joining, dying, making
and returning batches, the trainer receives every batch index exactly once, in order, within its bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.serveplan import ServeLedger

EVENTS = st.lists(
    st.tuples(st.sampled_from(["arrive", "lose", "add", "stale"]), st.integers(0, 1000)),
    max_size=200,
)


def run(ledger: ServeLedger[int], events: list[tuple[str, int]], feeders: int) -> list[int]:
    """Play ``events`` against ``ledger`` (the choice of feeder and batch drawn from each event's number),
    then let the surviving feeders finish; returns the indices delivered, checking the bounds throughout."""
    names = iter(range(10**6))
    in_flight: list[tuple[int, int]] = []  # (feeder, index) sent and not yet back, in any order
    for _ in range(feeders):
        ledger.add(next(names))
    delivered: list[int] = []

    def step() -> None:  # what the trainer does after each event: deliver what it can, then assign
        while (i := ledger.deliver()) is not None:
            delivered.append(i)
        in_flight.extend(ledger.assign())
        for f in ledger.feeders:
            assert len(ledger.owed(f)) <= ledger.max_in_flight
        assert ledger.held() <= ledger.window

    step()
    for kind, n in events:
        if kind == "arrive" and in_flight:
            f, i = in_flight.pop(n % len(in_flight))
            ledger.arrived(f, i)
        elif kind == "stale" and in_flight:  # a lost feeder's late answer, or a duplicate
            f, i = in_flight[n % len(in_flight)]
            if f not in ledger.feeders:
                assert not ledger.arrived(f, i)
                in_flight.remove((f, i))
        elif kind == "lose" and ledger.feeders:
            f = ledger.feeders[n % len(ledger.feeders)]
            assert ledger.lose(f) == sorted(i for g, i in in_flight if g == f)
        elif kind == "add" or not ledger.feeders:
            ledger.add(next(names))
        step()
    while not ledger.done:  # the feeders left finish in order of sending
        if not ledger.feeders:
            ledger.add(next(names))
            step()
        f, i = in_flight.pop(0)
        ledger.arrived(f, i)
        step()
    return delivered


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(0, 40),
    first=st.integers(0, 40),
    feeders=st.integers(0, 4),
    max_in_flight=st.integers(1, 3),
    window=st.integers(1, 6),
    events=EVENTS,
)
def test_every_batch_exactly_once_in_order(
    total: int, first: int, feeders: int, max_in_flight: int, window: int, events: list[tuple[str, int]]
) -> None:
    first = min(first, total)
    ledger: ServeLedger[int] = ServeLedger(total, first=first, max_in_flight=max_in_flight, window=window)
    assert run(ledger, events, feeders) == list(range(first, total))
    assert ledger.watermark == total and ledger.held() == 0


def test_a_lost_feeders_batches_go_first_to_the_next_feeder() -> None:
    ledger: ServeLedger[str] = ServeLedger(10, max_in_flight=2, window=4)
    ledger.add("a")
    ledger.add("b")
    assert sorted(ledger.assign(), key=lambda x: x[1]) == [("a", 0), ("b", 1), ("a", 2), ("b", 3)]
    assert ledger.arrived("b", 1)
    assert ledger.deliver() is None  # batch 0 is still with a
    assert ledger.lose("a") == [0, 2]
    assert not ledger.arrived("a", 0)  # a's late answer is refused
    ledger.add("c")
    assert sorted(ledger.assign()) == [("b", 2), ("c", 0)]  # the fewest in flight first
    assert ledger.arrived("c", 0)
    assert [ledger.deliver(), ledger.deliver()] == [0, 1]
    assert ledger.watermark == 2


def test_the_window_bounds_what_is_held() -> None:
    ledger: ServeLedger[int] = ServeLedger(100, max_in_flight=10, window=3)
    ledger.add(0)
    assert [i for _, i in ledger.assign()] == [0, 1, 2]
    assert ledger.arrived(0, 2) and ledger.arrived(0, 1)
    assert ledger.assign() == []  # 1 and 2 wait for 0: nothing past the window
    assert ledger.arrived(0, 0)
    assert [ledger.deliver() for _ in range(4)] == [0, 1, 2, None]
    assert [i for _, i in ledger.assign()] == [3, 4, 5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total": 3, "first": 4}, "first=4"),
        ({"total": 3, "max_in_flight": 0}, "max_in_flight=0"),
        ({"total": 3, "window": 0}, "window=0"),
    ],
)
def test_bad_bounds_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServeLedger(**kwargs)
