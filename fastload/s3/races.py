"""Races between a GET and its hedges, and the hedges themselves: the I/O half of :mod:`fastload.core.hedge`
that runs on the readers' threads (the watchdog that starts hedges is :mod:`fastload.s3.hedging`).

A part fetch (``s3.partfetch``) opens a :class:`Race` per GET attempt; the GET is the race's first
:class:`Runner` and runs on the fetch's own thread, reporting its progress (``head_at``, ``got``,
``progress_at``: plain attribute writes). When the watchdog finds it lagging it adds a runner
(:meth:`Race.launch`) and a hedge (:func:`run_hedge`) goes out on a short-lived thread named
``fastload-s3-hedge``: the bytes the original has not received yet, over new connections, as ``pieces``
concurrent ranges (each on a thread of its own), into a buffer of its own, every answer checked like any
(206, Content-Range, If-Match). The first runner to finish :meth:`Race.claim`\\ s the race; the others are
aborted (their sockets shut down, which wakes a blocked read). A hedge's failures only end the hedge: the
original GET decides the error. Races of one reader share a :class:`RaceGroup`: its count of finished races
tells the watchdog when the reader's silent GETs are stranded (``core.hedge``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from fastload.core import hedge as policy_mod
from fastload.core.hedge import HedgePolicy, split_range
from fastload.core.ranges import ByteRange, Verdict, check_response
from fastload.s3.objectio import Abort, ObjectIO, ObjectState, fill, overlong
from fastload.s3.partbuffers import new_buffer
from fastload.s3.stats import S3Stats

Timing = tuple[int, float, float, float]  # ``observe``'s figures: bytes, first byte, total, longest gap


class RaceOwner(Protocol):
    """What a race reports to (:class:`~fastload.s3.hedging.Hedger`)."""

    stats: S3Stats

    def observe(self, nbytes: int, first_byte_s: float, total_s: float, max_gap_s: float) -> None: ...

    def closed(self, race: Race, wasted_bytes: int) -> None: ...


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
        hedger: RaceOwner,
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


def run_hedge(
    race: Race,
    runner: Runner,
    cur: ByteRange,
    io: ObjectIO,
    state: ObjectState,
    sized: threading.Event | None,
    throttled: Callable[[Exception], bool],
) -> None:
    """A hedge (on its own thread): the bytes of ``cur`` (the attempt's range) from ``runner.offset`` on,
    over new connections (``runner.pieces`` concurrent ranges, once the object's size is known), into a
    buffer of its own; claims the race if it has them all first. ``sized`` is set once an answer gave the
    object's size; ``throttled(exc)``: whether a failed GET was throttled (the store's rule), which holds
    hedging back (``core.hedge``)."""
    start, size = cur.start + runner.offset, state.size
    end = cur.end if size is None else min(cur.end, size)
    if start >= end:
        return
    ranges = split_range(ByteRange(start, end), runner.pieces if size is not None else 1)
    whole = memoryview(new_buffer(end - start)) if size is not None else None
    lock, heads = threading.Lock(), [0]
    stats = race.hedger.stats

    def into(piece: ByteRange, n: int) -> memoryview:  # where a piece's ``n`` bytes go
        nonlocal whole
        if whole is None:  # one piece of an object of unknown size: its answer says how long
            whole = memoryview(new_buffer(n))
        return whole[piece.start - start : piece.start - start + n]

    def headed() -> None:
        with lock:
            heads[0] += 1
            if heads[0] == len(ranges):
                runner.head_at = runner.progress_at = time.monotonic()

    def progressed(n: int, now: float) -> None:
        with lock:
            runner.got += n
            runner.progress_at = now

    def piece(i: int) -> None:
        abort = runner.abort if len(ranges) == 1 else runner.abort.child()
        results[i] = _piece(ranges[i], io, state, abort, into, sized, headed, progressed, stats, throttled)
        if results[i] is None:
            runner.abort.fire()  # one range failed: the hedge has lost, its other ranges stop

    results: list[Timing | None] = [None] * len(ranges)
    others = [
        threading.Thread(target=piece, args=(i,), name="fastload-s3-hedge", daemon=True)
        for i in range(1, len(ranges))
    ]
    for thread in others:
        thread.start()
    piece(0)
    for thread in others:
        thread.join()
    if any(r is None for r in results) or whole is None:
        runner.failed = True  # (the watchdog judges the race on the GETs still in flight)
        if race.winner is None:  # (aborted because another GET of the race won: it lost, it did not fail)
            stats.hedge_event(failed=1)
        return
    runner.buf, runner.end = whole.obj, start + len(whole) - cur.start
    if race.claim(runner):
        for timing in results:
            if timing is not None:
                race.hedger.observe(*timing)


def _piece(
    asked: ByteRange,
    io: ObjectIO,
    state: ObjectState,
    abort: Abort,
    into: Callable[[ByteRange, int], memoryview],
    sized: threading.Event | None,
    headed: Callable[[], None],
    progressed: Callable[[int, float], None],
    stats: S3Stats,
    throttled: Callable[[Exception], bool],
) -> Timing | None:
    """One GET of a hedge, on a new connection, its body read into ``into(asked, length)``: the ``observe``
    figures once every byte of ``asked`` (clipped to the object) has come, None if not (a throttled answer
    holds hedging back)."""
    sent_at = time.monotonic()
    got = [0]

    def counted(n: int, now: float) -> None:
        got[0] += n
        progressed(n, now)

    try:
        body = io.get(state.headers(asked), abort=abort, fresh=True)
    except Exception as exc:
        if throttled(exc):
            stats.throttled()
        return None
    head_at = time.monotonic()
    headed()
    try:
        check = check_response(body.status, body.content_range, body.content_length, asked, state.size)
        if check.verdict is not Verdict.PARTIAL or check.total is None:
            return None
        state.learn(check.total, body.etag)
        if sized is not None:
            sized.set()
        view = into(asked, min(asked.end, check.total) - asked.start)
        n, gap = fill(body, view, head_at, counted)
        if n < len(view) or overlong(body):
            return None
        return n, head_at - sent_at, time.monotonic() - sent_at, gap
    except Exception as exc:
        if throttled(exc):
            stats.throttled()
        return None
    finally:
        body.close()
        stats.request_done(head_at - sent_at, got[0])
