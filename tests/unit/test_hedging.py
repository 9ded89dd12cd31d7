"""The hedging machinery of ``fastload.s3.hedging`` without a network: the watchdog hedges a lagging
request (once per lag, within the budget), the first runner to finish wins and the others are aborted,
throttling holds hedges back, and the counters say so."""

from __future__ import annotations

import threading
import time

from fastload.core.hedge import HedgePolicy
from fastload.s3.hedging import Abort, Hedger, Race, Runner
from fastload.s3.stats import S3Stats

FAST = HedgePolicy(floor_s=0.05, ceiling_s=1.0, burst=1, max_fraction=0.0001, cold_factor=1.0)


def finishing(race: Race, runner: Runner) -> None:
    """A hedge that answers at once with one byte and claims the race."""
    runner.head_at = runner.progress_at = time.monotonic()
    runner.got, runner.buf, runner.end = 1, b"x", 1
    race.claim(runner)


def test_a_lagging_request_is_hedged_and_the_hedge_wins() -> None:
    stats = S3Stats()
    race = Hedger(stats).race(FAST, 1, finishing)
    deadline = time.monotonic() + 3
    while race.winner is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert race.hedges and race.winner is race.hedges[0]
    assert race.primary.abort.fired  # the original GET was cut short
    assert race.settle(1.0) is race.hedges[0]
    race.close()
    hedges = stats.snapshot()["hedges"]
    assert (hedges["sent"], hedges["won"]) == (1, 1)


def test_the_original_wins_when_it_finishes_first_and_the_hedge_is_aborted() -> None:
    stats = S3Stats()
    release = threading.Event()

    def slow(race: Race, runner: Runner) -> None:
        runner.head_at = runner.progress_at = time.monotonic()
        release.wait(2)
        runner.got = 5  # bytes that came in vain

    race = Hedger(stats).race(FAST, 10, slow)
    deadline = time.monotonic() + 3
    while not race.hedges and time.monotonic() < deadline:
        time.sleep(0.01)
    assert race.claim(race.primary)
    assert race.hedges[0].abort.fired and not race.primary.abort.fired
    release.set()
    race.close()
    hedges = stats.snapshot()["hedges"]
    assert (hedges["sent"], hedges["won"]) == (1, 0)


def test_the_budget_and_throttling_hold_hedges_back() -> None:
    stats = S3Stats()
    hedger = Hedger(stats)
    first = hedger.race(FAST, 1, finishing)  # the burst of one
    second = hedger.race(FAST, 1, finishing)  # over the budget
    time.sleep(0.5)
    assert len(first.hedges) + len(second.hedges) == 1
    cut = second if not second.hedges else first
    assert cut.primary.abort.fired  # over the budget: the silent GET is cut short and retried, not waited out
    first.close()
    second.close()
    stats.throttled()
    generous = HedgePolicy(floor_s=0.05, ceiling_s=1.0, throttle_quiet_s=30.0, cold_factor=1.0)
    third = hedger.race(generous, 1, finishing)
    time.sleep(0.4)
    assert not third.hedges
    third.close()
    hedges = stats.snapshot()["hedges"]
    assert hedges["suppressed_budget"] == 1 and hedges["suppressed_throttle"] == 1, hedges
    assert hedges["cut"] == 1 and not third.primary.abort.fired  # throttled: AIMD's, not cut


def test_abort_shuts_down_a_socket_attached_late_or_early() -> None:
    class Sock:
        def __init__(self) -> None:
            self.shut = 0

        def shutdown(self, how: int) -> None:
            self.shut += 1

    early, late = Sock(), Sock()
    abort = Abort()
    abort.attach(early)
    abort.fire()
    assert early.shut == 1
    abort.detach()
    abort.attach(late)  # fired before: cut at once
    assert late.shut == 1
