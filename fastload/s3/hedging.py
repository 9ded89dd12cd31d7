"""Hedged GETs, the I/O half of :mod:`fastload.core.hedge`: this process's latency model, the races between
a GET and its hedges, and the watchdog thread that starts hedges.

A reader opens a :class:`Race` per GET attempt (:meth:`Hedger.race`); the GET is the race's first
:class:`Runner` and runs on the reader's own thread, reporting its progress (``head_at``, ``got``,
``progress_at``: plain attribute writes). The watchdog (one daemon thread per process, running while races
are open, ticking at a quarter of the deadlines' floor) asks ``core.hedge`` whether the newest runner in
flight of each race lags and whether a hedge may go out now; if so it adds a runner and starts the reader's
hedge function on a short-lived thread named ``fastload-s3-hedge`` (a split hedge runs its other ranges on
threads of their own). Races of one reader share a :class:`RaceGroup`: its count of finished races tells
the watchdog when the reader's silent GETs are stranded (``core.hedge``). The first runner to finish
:meth:`Race.claim`\\ s the race; the others are aborted (their sockets shut down, which wakes a blocked
read). Hedges bypass the AIMD gate (they are capped by the budget and never sent while the store throttles).
A silent GET that may not be hedged because the budget is spent is cut short instead and retried at once
(not waited out).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from fastload.core import hedge as policy_mod
from fastload.core.hedge import HedgePolicy, LatencyModel
from fastload.s3.stats import S3Stats

IDLE_EXIT_S = 2.0  # the watchdog thread ends after this long without open races


class Abort:
    """Lets another thread cut one request short: shuts its connection's socket down (waking a read that
    blocks on it). Attached when the request has a socket, detached before the connection is reused."""

    __slots__ = ("_children", "_lock", "_sock", "fired")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: Any = None
        self._children: list[Abort] = []
        self.fired = False

    def child(self) -> Abort:
        """An abort of its own for one of several requests (a split hedge's ranges), fired with this one."""
        child = Abort()
        with self._lock:
            self._children.append(child)
            fired = self.fired
        if fired:
            child.fire()
        return child

    def attach(self, sock: Any) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                _shutdown(sock)

    def detach(self) -> None:
        with self._lock:
            self._sock = None

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                _shutdown(self._sock)
            children = list(self._children)
        for child in children:
            child.fire()


def _shutdown(sock: Any) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(2)  # socket.SHUT_RDWR


class RaceGroup:
    """The races of one reader: how many of them have finished (for ``core.hedge``'s "stranded" rule)."""

    __slots__ = ("finished",)

    def __init__(self) -> None:
        self.finished = 0


class Runner:
    """One GET of a race (a hedge: ``pieces`` concurrent GETs of consecutive ranges). ``offset``: where its
    bytes start within the race's range (the original: 0; a hedge: what the original had received when the
    hedge was sent); ``got``: bytes it has received (for the original: up to which byte of the range its
    buffer is filled); ``head_at``: when its (every piece's) response head arrived; ``failed``: a hedge
    that ended without its bytes (no longer in flight)."""

    __slots__ = (
        "abort",
        "buf",
        "end",
        "failed",
        "got",
        "head_at",
        "offset",
        "pieces",
        "progress_at",
        "sent_at",
        "size",
    )

    def __init__(self, offset: int, size: int, sent_at: float, pieces: int = 1) -> None:
        self.offset, self.size, self.sent_at, self.pieces = offset, size, sent_at, pieces
        self.head_at: float | None = None
        self.progress_at = sent_at
        self.got = 0
        self.abort = Abort()
        self.buf: Any = None  # a hedge's bytes, once it has them all
        self.end: int | None = None  # a hedge's end (within the range), once its answer says it
        self.failed = False


class Race:
    """A GET attempt and its hedges; the first to finish wins (see the module docstring)."""

    def __init__(
        self,
        hedger: Hedger,
        policy: HedgePolicy,
        size: int,
        start_hedge: Callable[[Race, Runner], None],
        now: float,
        group: RaceGroup | None = None,
        baseline: int | None = None,
    ) -> None:
        self.hedger, self.policy, self.group = hedger, policy, group
        # its group's finished races when its range was first asked for (by this or an earlier attempt)
        self.baseline = baseline if baseline is not None else group.finished if group is not None else 0
        self.retry = baseline is not None  # a later attempt at the same range
        self.primary = Runner(0, size, now)
        self.hedges: list[Runner] = []
        self.why: policy_mod.Lag | None = None  # why its first hedge was sent
        self.winner: Runner | None = None
        self.closed = False
        self.suppressed = False  # a suppressed hedge was counted once already
        self._running = 0
        self._start_hedge = start_hedge
        self._cond = threading.Condition()

    @property
    def newest(self) -> Runner:
        """The latest GET still in flight: the newest hedge that has not failed, else the original (a
        failed hedge's frozen progress says nothing of the GETs left: judged on it, a headless original's
        next hedge would go out late and unsplit)."""
        for runner in reversed(self.hedges):
            if not runner.failed:
                return runner
        return self.primary

    def launch(self, now: float, pieces: int = 1) -> None:
        """Send a hedge for the bytes the original has not received yet, as ``pieces`` concurrent ranges
        (called by the watchdog)."""
        runner = Runner(self.primary.got, self.primary.size - self.primary.got, now, pieces)
        with self._cond:
            if self.closed or self.winner is not None:
                return
            self.hedges.append(runner)
            self._running += 1
        thread = threading.Thread(target=self._run, args=(runner,), name="fastload-s3-hedge", daemon=True)
        thread.start()

    def _run(self, runner: Runner) -> None:
        try:
            self._start_hedge(self, runner)
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def claim(self, runner: Runner) -> bool:
        """``runner`` has all its bytes: it wins unless another did first; the others are aborted."""
        with self._cond:
            if self.winner is not None:
                return self.winner is runner
            self.winner = runner
            self._cond.notify_all()
        for other in (self.primary, *self.hedges):
            if other is not runner:
                other.abort.fire()
        return True

    def cut_short(self) -> bool:
        """Abort every GET of the race (the original and any hedge): the original's thread fails the
        attempt and retries at once."""
        with self._cond:
            if self.closed or self.winner is not None:
                return False
            self.closed = True
        for runner in (self.primary, *self.hedges):
            runner.abort.fire()
        return True

    def settle(self, timeout_s: float) -> Runner | None:
        """After the original failed: the hedge that won (waiting up to ``timeout_s`` for those still
        running), or None."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.closed = True  # no new hedges
            while self.winner is None and self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self.winner if self.winner is not self.primary else None

    def close(self) -> None:
        """The original's thread is done with the race: abort hedges still running, count what was lost."""
        with self._cond:
            self.closed = True
            winner = self.winner
        for runner in self.hedges:
            if runner is not winner:
                runner.abort.fire()
        wasted = sum(r.got for r in self.hedges if r is not winner)
        if winner is not None and winner is not self.primary:
            wasted += max(0, self.primary.got - winner.offset)
        self.hedger.closed(self, wasted)


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
                    heard = any(r.head_at is not None for r in (race.primary, *race.hedges))
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
        silent = why is not policy_mod.Lag.SLOW and (why is not policy_mod.Lag.STRANDED or not race.retry)
        if no_hedge and silent and race.cut_short():
            # no budget for a second GET: a silent one is cut now and retried (no more requests than
            # waiting out read_timeout_s would make, the bytes it had are kept); at the stranded deadline
            # only once per range: a busy machine's slow but healthy GETs may pass it, and cutting their
            # retries there again and again would only restart them
            self.stats.hedge_event(cut=1)
        if not race.suppressed and verdict is not policy_mod.Verdict.ENOUGH:
            race.suppressed = True
            key = "suppressed_throttle" if verdict is policy_mod.Verdict.THROTTLED else "suppressed_budget"
            self.stats.hedge_event(**{key: 1})
