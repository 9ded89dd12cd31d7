"""Hedged GETs, the watchdog half of :mod:`fastload.core.hedge`: this process's latency model, its open
races (``s3.races``) and the watchdog thread that starts hedges.

A part fetch opens a :class:`~fastload.s3.races.Race` per GET attempt (:meth:`Hedger.race`). The watchdog
(one daemon thread per process, running while races are open, ticking at a quarter of the deadlines'
floor) asks ``core.hedge`` whether the newest runner in flight of each race lags and whether a hedge may go
out now; if so it launches one (:meth:`~fastload.s3.races.Race.launch`, which runs
:func:`~fastload.s3.races.run_hedge`). Races of one reader share a :class:`~fastload.s3.races.RaceGroup`:
its count of finished races tells the watchdog when the reader's silent GETs are stranded
(``core.hedge``). Hedges bypass the AIMD gate (they are capped by the budget and never sent while the store
throttles). A silent GET that may not be hedged because the budget is spent is cut short instead and
retried at once (not waited out).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fastload.core import hedge as policy_mod
from fastload.core.hedge import HedgePolicy, LatencyModel
from fastload.s3.objectio import Abort
from fastload.s3.races import Race, RaceGroup, Runner
from fastload.s3.stats import S3Stats

__all__ = ["IDLE_EXIT_S", "Abort", "Hedger", "Race", "RaceGroup", "Runner"]  # (races' names, as before)

IDLE_EXIT_S = 2.0  # the watchdog thread ends after this long without open races


class Hedger:
    """This process's latency model, open races and hedge counters (kept by :mod:`fastload.s3.runtime`)."""

    def __init__(self, stats: S3Stats, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.stats, self.clock = stats, clock
        self.model = LatencyModel()
        self.patience = policy_mod.Patience()
        self.requests = 0
        self.hedges = 0
        self._races: set[Race] = set()
        self.starvation = policy_mod.Starvation()  # written and read by the watchdog only
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None

    def observe(self, nbytes: int, first_byte_s: float, total_s: float, max_gap_s: float) -> None:
        """A finished GET (feeds the model every deadline comes from)."""
        with self._lock:
            self.model.observe(nbytes, first_byte_s, total_s, max_gap_s)

    def deadlines(self, policy: HedgePolicy) -> policy_mod.Deadlines:
        with self._lock:
            return policy_mod.deadlines(self.model, policy, self.patience.factors)

    def race(
        self,
        policy: HedgePolicy,
        size: int,
        start_hedge: Callable[[Race, Runner], None],
        group: RaceGroup | None = None,
        *,
        baseline: int | None = None,
    ) -> Race:
        """Open a race for a GET of ``size`` bytes (``start_hedge(race, runner)`` runs a hedge) by the
        reader whose races share ``group``; ``baseline``: the :attr:`Race.baseline` of an earlier attempt
        at its range."""
        race = Race(self, policy, size, start_hedge, self.clock(), group, baseline)
        with self._lock:
            self.requests += 1
            self._races.add(race)
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, args=(policy.floor_s,), name="fastload-hedge-watch", daemon=True
                )
                self._watchdog.start()
        return race

    def closed(self, race: Race, wasted_bytes: int) -> None:
        won = race.winner is not None and race.winner is not race.primary
        with self._lock:
            self._races.discard(race)
            if race.group is not None and race.winner is not None:
                race.group.finished += 1
            if race.hedges and race.winner is not None and race.why is not None:  # (a failed race: nothing)
                self.patience.hedge_ended(race.why, won=won)
        if race.hedges:
            self.stats.hedge_event(won=int(won), wasted_bytes=wasted_bytes)

    def _watch(self, floor_s: float) -> None:
        idle_since: float | None = None
        tick = min(0.1, floor_s / 4)
        while True:
            began = time.monotonic()
            time.sleep(tick)
            self.starvation.slept(tick, began, time.monotonic())  # (runners' times are monotonic too)
            with self._lock:
                races = list(self._races)
                if not races:
                    idle_since = idle_since if idle_since is not None else self.clock()
                    if self.clock() - idle_since > IDLE_EXIT_S:
                        self._watchdog = None
                        return
                    continue
                idle_since = None
                stretch = dict(self.patience.factors)
                limits = {p: policy_mod.deadlines(self.model, p, stretch) for p in {r.policy for r in races}}
                tick = min(0.1, min(p.floor_s for p in limits) / 4)
            now = self.clock()
            silent: dict[RaceGroup, int] = {}  # by reader: open races without any response head
            answered: dict[RaceGroup, int] = {}  # ... and with one
            for race in races:
                if race.group is not None and race.winner is None and not race.closed:
                    # (a failed hedge's head is no answer: that GET is over, its reader still waits)
                    heard = any(r.head_at is not None and not r.failed for r in (race.primary, *race.hedges))
                    counts = answered if heard else silent
                    counts[race.group] = counts.get(race.group, 0) + 1
            for race in races:
                group = race.group
                stranded = group is not None and policy_mod.stranded(
                    finished=group.finished - race.baseline,
                    silent=silent.get(group, 0),
                    answered=answered.get(group, 0),
                )
                self._check(race, now, limits[race.policy], stranded)

    def _check(self, race: Race, now: float, limits: policy_mod.Deadlines, stranded: bool = False) -> None:
        if race.closed or race.winner is not None:
            return
        runner = race.newest
        flight = policy_mod.Flight(runner.sent_at, runner.head_at, runner.progress_at, runner.size, stranded)
        why = policy_mod.lag(self.starvation.excuse(flight), now, limits)
        if why is None:
            return
        with self._lock:
            verdict = policy_mod.decide(
                race.policy,
                now=now,
                last_throttle_at=self.stats.last_throttle_at,
                requests=self.requests,
                hedges=self.hedges,
                hedges_of_this=len(race.hedges),
            )
            if verdict is policy_mod.Verdict.HEDGE:
                self.hedges += 1
        if verdict is policy_mod.Verdict.HEDGE:
            headless = why in (policy_mod.Lag.FIRST_BYTE, policy_mod.Lag.STRANDED)  # split (``core.hedge``)
            pieces = limits.pieces(race.primary.size - race.primary.got) if headless else 1
            self.stats.hedge_event(sent=1, gets=pieces, stranded=int(why is policy_mod.Lag.STRANDED))
            if race.why is None:
                race.why = why
            race.launch(now, pieces)
            return
        no_hedge = verdict in (policy_mod.Verdict.NO_BUDGET, policy_mod.Verdict.ENOUGH)
        early = why is policy_mod.Lag.STRANDED and (race.retry or runner is not race.primary)
        if no_hedge and why is not policy_mod.Lag.SLOW and not early and race.cut_short():
            # no budget for a second GET: a silent one is cut now and retried (no more requests than
            # waiting out read_timeout_s would make, the bytes it had are kept); at the stranded deadline
            # only a first attempt's original GET: a busy machine's slow but healthy GETs may pass it, and
            # cutting their retries there again and again would only restart them; nor a hedge in flight
            # (its race has ``max_hedges``): sent moments ago, it is as new as the retry that would replace
            # it, and cutting it there threw away the hedge that was about to bring the bytes (the
            # stranded evidence, the reader's other GETs come back, is about the GETs sent with the
            # original, not with a hedge); either is cut at the first-byte deadline
            self.stats.hedge_event(cut=1)
        if not race.suppressed and verdict is not policy_mod.Verdict.ENOUGH:
            race.suppressed = True
            key = "suppressed_throttle" if verdict is policy_mod.Verdict.THROTTLED else "suppressed_budget"
            self.stats.hedge_event(**{key: 1})
