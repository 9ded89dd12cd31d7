"""The hedging machinery of ``fastload.s3.hedging`` without a network: the watchdog hedges a lagging
request (once per lag, within the budget), the first runner to finish wins and the others are aborted,
throttling holds hedges back, and the counters say so."""

from __future__ import annotations

import threading
import time
from typing import Any

from fastload.core.hedge import HedgePolicy
from fastload.core.ranges import ByteRange
from fastload.s3.hedging import Abort, Hedger, Race, RaceGroup, Runner
from fastload.s3.objectio import ObjectState
from fastload.s3.races import run_hedge
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


def test_a_reader_waiting_only_for_silent_gets_has_them_hedged_early() -> None:
    """Three of a reader's four GETs came back, the fourth is silent: hedged at 3x the median first byte
    (0.06 s), not at 3x the p99 (1.5 s); a silent GET of a reader whose other GETs still stream waits."""
    stats = S3Stats()
    hedger = Hedger(stats)
    for i in range(40):  # first bytes of 20 ms with a tail at 500 ms
        first = 0.5 if i % 10 == 0 else 0.02
        hedger.observe(1 << 20, first, first + 0.02, 0.01)
    policy = HedgePolicy(floor_s=0.05, ceiling_s=5.0, burst=3, max_fraction=0.0001)
    group, busy = RaceGroup(), RaceGroup()
    races = [hedger.race(policy, 1, finishing, group) for _ in range(4)]
    others = [hedger.race(policy, 1, finishing, busy) for _ in range(4)]
    for race in races[:3]:
        race.primary.head_at = time.monotonic()
    for race in others[:3]:  # streaming bodies (progress stamped ahead: never stalled in this test)
        race.primary.head_at, race.primary.progress_at = time.monotonic(), time.monotonic() + 60
    for race in races[:3]:
        assert race.claim(race.primary)
        race.close()
    began = time.monotonic()
    while races[3].winner is None and time.monotonic() - began < 1.0:
        time.sleep(0.01)
    assert races[3].winner is races[3].hedges[0] and time.monotonic() - began < 1.0
    assert not others[3].hedges  # its reader still receives (three GETs with a head, none done)
    for race in (races[3], *others):
        race.close()
    hedges = stats.snapshot()["hedges"]
    assert (hedges["sent"], hedges["stranded"], hedges["gets"], hedges["won"]) == (1, 1, 1, 1), hedges


def test_a_child_abort_fires_with_its_parent() -> None:
    class Sock:
        shut = 0

        def shutdown(self, how: int) -> None:
            self.shut += 1

    parent = Abort()
    first, sock = parent.child(), Sock()
    first.attach(sock)
    parent.fire()
    assert first.fired and sock.shut == 1
    assert parent.child().fired  # made after the parent fired: fired at once


def test_without_budget_a_stranded_get_is_cut_once_its_retry_waits_for_the_first_byte_deadline() -> None:
    """Without budget a stranded GET is cut and retried at the stranded deadline, but its retry is cut only
    at the first-byte one: a busy machine's slow but healthy GET may pass the stranded deadline, and cutting
    it there again and again would only restart it."""
    stats = S3Stats()
    hedger = Hedger(stats)
    for i in range(40):
        first = 0.5 if i % 10 == 0 else 0.02
        hedger.observe(1 << 20, first, first + 0.02, 0.01)
    broke = HedgePolicy(floor_s=0.05, ceiling_s=5.0, burst=0, max_fraction=0.0001)
    group = RaceGroup()
    races = [hedger.race(broke, 1, finishing, group) for _ in range(4)]
    for race in races[:3]:
        race.primary.head_at = time.monotonic()
        assert race.claim(race.primary)
        race.close()
    began = time.monotonic()
    while not races[3].primary.abort.fired and time.monotonic() - began < 1.0:
        time.sleep(0.01)
    assert races[3].primary.abort.fired and not races[3].hedges  # cut (no hedge: no budget)
    races[3].close()
    retry = hedger.race(broke, 1, finishing, group, baseline=races[3].baseline)
    time.sleep(0.3)  # past the stranded deadline (0.06 s), not the first-byte one (1.5 s)
    assert not retry.primary.abort.fired and not retry.hedges
    retry.close()
    hedges = stats.snapshot()["hedges"]
    assert hedges["cut"] == 1 and hedges["suppressed_budget"] == 2, hedges


def test_a_failed_hedge_is_not_what_the_watchdog_judges_the_race_on() -> None:
    """A hedge that got its head and then failed (a wrong Content-Range, a reset) is no longer in flight:
    the race's lag is judged on the GETs left (the headless original), not on the failed hedge's frozen
    progress, so the next hedge goes out as one for a GET without a head."""
    stats = S3Stats()
    started = threading.Event()

    def failing(race: Race, runner: Runner) -> None:
        runner.head_at = runner.progress_at = time.monotonic()
        runner.failed = True
        started.set()

    generous = HedgePolicy(floor_s=0.05, ceiling_s=1.0, burst=1, max_fraction=0.0001, cold_factor=1.0)
    race = Hedger(stats).race(generous, 1, failing)
    assert started.wait(3)
    assert race.newest is race.primary  # (its only hedge failed)
    race.close()
    spare = Runner(0, 1, time.monotonic())
    race.hedges.append(spare)
    assert race.newest is spare  # a hedge still in flight is the newest


def stranded_fourth(policy: HedgePolicy, start_hedge: Any) -> tuple[Hedger, S3Stats, Race]:
    """A reader's four GETs, three of them back: the fourth (its race returned) is stranded, deadlines as
    in the tests above (stranded 0.06 s, first byte 1.5 s)."""
    stats = S3Stats()
    hedger = Hedger(stats)
    for i in range(40):
        first = 0.5 if i % 10 == 0 else 0.02
        hedger.observe(1 << 20, first, first + 0.02, 0.01)
    group = RaceGroup()
    races = [hedger.race(policy, 1, start_hedge, group) for _ in range(4)]
    for race in races[:3]:
        race.primary.head_at = time.monotonic()
        assert race.claim(race.primary)
        race.close()
    return hedger, stats, races[3]


def test_a_hedge_in_flight_is_not_cut_at_the_stranded_deadline_when_no_more_may_go() -> None:
    """The stranded GET's hedge (its last: ``max_hedges`` 1) has no head yet after 0.3 s, past the stranded
    deadline but not the first-byte one: it is left to finish (and wins), not cut with its race and
    replaced by a retry that is no newer (a loaded machine's split hedge, four new connections, often
    takes that long for its heads)."""
    release = threading.Event()

    def headless_then_done(race: Race, runner: Runner) -> None:
        release.wait(5)
        if not runner.abort.fired:
            finishing(race, runner)

    one = HedgePolicy(floor_s=0.05, ceiling_s=5.0, burst=3, max_fraction=0.0001, max_hedges=1)
    _, stats, race = stranded_fourth(one, headless_then_done)
    began = time.monotonic()
    while not race.hedges and time.monotonic() - began < 1.0:
        time.sleep(0.01)
    assert race.hedges  # sent at the stranded deadline
    time.sleep(0.3)
    assert not race.hedges[0].abort.fired and not race.primary.abort.fired and not race.closed
    release.set()
    assert race.settle(2.0) is race.hedges[0]
    race.close()
    hedges = stats.snapshot()["hedges"]
    assert (hedges["sent"], hedges["won"], hedges["cut"]) == (1, 1, 0), hedges


def test_a_failed_hedge_s_head_does_not_end_the_stranding() -> None:
    """The stranded GET's first hedge got its heads, then failed (a wrong Content-Range): its reader still
    waits for that GET alone, so the next hedge goes out at the stranded deadline too, not at the
    first-byte one (1.5 s), as if the failed hedge were an answer its reader still receives."""

    def fails_then_finishes(race: Race, runner: Runner) -> None:
        if len(race.hedges) == 1:
            runner.head_at = runner.progress_at = time.monotonic()
            runner.failed = True
        else:
            finishing(race, runner)

    policy = HedgePolicy(floor_s=0.05, ceiling_s=5.0, burst=3, max_fraction=0.0001)
    _, stats, race = stranded_fourth(policy, fails_then_finishes)
    began = time.monotonic()
    while race.winner is None and time.monotonic() - began < 1.2:
        time.sleep(0.01)
    assert len(race.hedges) == 2 and race.winner is race.hedges[1], race.hedges
    race.close()
    hedges = stats.snapshot()["hedges"]
    assert (hedges["sent"], hedges["stranded"], hedges["won"]) == (2, 2, 1), hedges


class StuckIO:
    """An object whose GETs never answer until aborted (then the connection is reset)."""

    abortable = True

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Any:
        assert abort is not None
        while not abort.fired:
            time.sleep(0.005)
        raise ConnectionResetError("aborted")

    def head(self, headers: dict[str, str]) -> Any:
        raise AssertionError("no HEAD here")


def test_a_hedge_aborted_because_the_original_won_lost_it_did_not_fail() -> None:
    """``failed`` counts hedges that ended without their bytes by themselves (a wrong answer, a reset):
    a hedge cut because the original GET finished first lost the race, and is not counted failed."""
    state = ObjectState("bucket", "key", None)
    state.learn(10, '"etag"')

    def hedge(race: Race, runner: Runner) -> None:
        run_hedge(race, runner, ByteRange(0, 10), StuckIO(), state, None, lambda exc: False)

    stats = S3Stats()
    race = Hedger(stats).race(FAST, 10, hedge)
    deadline = time.monotonic() + 3
    while not race.hedges and time.monotonic() < deadline:
        time.sleep(0.01)
    assert race.claim(race.primary)
    while not race.hedges[0].failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert race.hedges[0].failed  # (no longer in flight)
    race.close()
    hedges = stats.snapshot()["hedges"]
    assert (hedges["sent"], hedges["won"], hedges["failed"]) == (1, 0, 0), hedges
