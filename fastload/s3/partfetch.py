"""One part's fetch: the bytes of a range of one object, retried until complete and correct, each attempt a
race against its hedges.

A :class:`Fetcher` holds what a reader's fetches share (the object's transport, ``s3.objectio``'s
:class:`~fastload.s3.objectio.ObjectState`, the process's runtime, the retry loop, the hedge policy and the
reader's :class:`~fastload.s3.races.RaceGroup`); :meth:`Fetcher.fetch` runs one :class:`PartFetch`. Each
attempt is one GET with ``Range`` and ``If-Match`` for the bytes after the last good one, its answer
checked against the range contract (``core.ranges``) and its body read (:func:`~fastload.s3.objectio.fill`)
straight into the part's buffer (a pooled one: ``s3.partbuffers``); failures are retried by ``core.retry``
(``s3.retrying``). An attempt runs as a race (``s3.races``, policy in ``core.hedge``): if it lags, a hedge
fetches its remaining bytes and may win; the part is then completed with the hedge's bytes. A 200 with the
whole object is kept on the object's state (the reader serves every later read from it); one over
:data:`WHOLE_OBJECT_MAX_BYTES` is an error instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from fastload.config import S3Config
from fastload.core.hedge import HedgePolicy
from fastload.core.ranges import ByteRange, Verdict, check_response
from fastload.core.retry import Fault
from fastload.errors import ObjectChangedError, RangeReadError, S3Error
from fastload.s3.client import Failure, classify_exception, fail_fast_error
from fastload.s3.objectio import Body, ObjectIO, ObjectState, fill, overlong
from fastload.s3.partbuffers import Buffer, new_buffer
from fastload.s3.races import Race, RaceGroup, Runner, run_hedge
from fastload.s3.retrying import BadResponse, Retrier
from fastload.s3.runtime import S3Runtime
from fastload.s3.urlerrors import fail_fast_url_error

T = TypeVar("T")

WHOLE_OBJECT_MAX_BYTES = 1 << 30
"""The largest whole-object 200 (a server that ignores Range) taken into memory; a larger one is an error."""


def hedge_policy(config: S3Config) -> HedgePolicy | None:
    """The deadlines and hedge budget ``config`` asks for (None: no hedging)."""
    if config.hedge <= 0:
        return None
    ceiling = config.read_timeout_s
    return HedgePolicy(
        floor_s=min(config.hedge_floor_s, ceiling), ceiling_s=ceiling, max_fraction=config.hedge
    )


class Part:
    """A part's bytes, in the buffer its body was read into (copied once more: to the caller). ``pooled``:
    the buffer goes back to the process's pool once the part is dropped and no view of it is left."""

    __slots__ = ("buf", "pooled", "size")

    def __init__(self, buf: Buffer | bytes, size: int, *, pooled: bool = False) -> None:
        self.buf, self.size, self.pooled = buf, size, pooled

    def __len__(self) -> int:
        return self.size

    def view(self, offset: int, n: int) -> memoryview:
        """The bytes ``[offset, offset + n)``, not copied."""
        return memoryview(self.buf)[offset : offset + n]


class PastEnd(Exception):
    """416 on the first request: the read position is at or past the end of the object."""


class Lost(Exception):
    """The original GET finished after a hedge had won."""


class Fetcher:
    """What one reader's part fetches share (rebuilt by the reader after fork, with the same ``state``);
    ``part``/``first``: the reader's full and first part sizes (for pooled buffer sizes)."""

    def __init__(
        self,
        io: ObjectIO,
        state: ObjectState,
        config: S3Config,
        runtime: S3Runtime,
        retrier: Retrier,
        *,
        group: RaceGroup,
        closing: threading.Event,
        part: int,
        first: int,
        clock: Callable[[], float],
    ) -> None:
        self.io, self.state, self.config, self.runtime, self.retrier = io, state, config, runtime, retrier
        self.group, self.closing, self.part, self.first, self.clock = group, closing, part, first, clock
        self.policy = hedge_policy(config)

    def fetch(
        self,
        asked: ByteRange,
        *,
        first: bool = False,
        stop: threading.Event | None = None,
        sized: threading.Event | None = None,
    ) -> Part:
        """Bytes of ``asked`` (clipped to the object on the first request), retried until complete; see
        :class:`PartFetch`. :class:`PastEnd` when the first request starts past the object's end."""
        return self.retrying(PartFetch(self, asked, first=first, sized=sized).attempt, asked, "GET", stop)

    def head(self) -> None:
        """Learn size and ETag by a HEAD (retried like a GET)."""

        def attempt() -> None:
            started = self.clock()
            body = self.io.head(self.state.headers())
            body.close()
            self.runtime.stats.request_done(self.clock() - started, 0)
            if body.content_length is None:
                raise BadResponse(Failure(Fault.BAD_RANGE, body.status, "HEAD answer without Content-Length"))
            self.state.learn(int(body.content_length), body.etag)

        self.retrying(attempt, ByteRange(0, 1), "HEAD")

    def buffer(self, want: int) -> Buffer:
        # parts of one size class share pooled buffers: a short last part uses a whole one
        return self.runtime.buffers.take(self.part if self.first < want <= self.part else want)

    def retrying(
        self, attempt: Callable[[], T], asked: ByteRange, verb: str, stop: threading.Event | None = None
    ) -> T:
        """``attempt()`` until it succeeds, under ``core.retry``; the error it gives up with names the
        object and ``asked``."""
        state = self.state

        def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
            if failure.fault is Fault.CHANGED:
                return ObjectChangedError(
                    f"{state.url} was overwritten while being read ({failure.message} on If-Match "
                    f"{state.etag}); open it again to read the new version",
                    bucket=state.bucket,
                    key=state.key,
                    url=state.object_url,
                )
            if failure.fault in (Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT):
                if state.object_url is not None:
                    return fail_fast_url_error(failure, state.object_url)
                return fail_fast_error(failure, state.bucket, state.key)
            end = asked.end if state.size is None else min(asked.end, state.size)
            return RangeReadError(
                bucket=state.bucket,
                key=state.key,
                start=asked.start,
                end=max(end, asked.start + 1),
                attempts=tries,
                elapsed_s=elapsed_s,
                last_error=f"{verb}: {failure.message}",
                cause=failure.fault.value,
                url=state.object_url,
            )

        return self.retrier.call(attempt, give_up, stop=stop or self.closing)


class PartFetch:
    """The fetch of one range ``asked``: its buffer and how many of its bytes are in it (``got``, kept
    across attempts: each retry asks only for the rest), and its first race's baseline (``core.hedge``'s
    stranded rule counts from when the range was first asked for). ``first``: the reader's first request
    (416 means past the end); ``sized`` is set once an answer has given the object's size and ETag (before
    its body is read)."""

    def __init__(
        self, fetcher: Fetcher, asked: ByteRange, *, first: bool, sized: threading.Event | None
    ) -> None:
        self.fetcher, self.asked, self.first, self.sized = fetcher, asked, first, sized
        self.buf: Buffer | None = None
        self.got = 0
        self.baseline: int | None = None

    def attempt(self) -> Part:
        """One attempt: a GET of the bytes still missing, raced against its hedges."""
        cur = ByteRange(self.asked.start + self.got, self.asked.end)
        race = self._race(cur)
        try:
            return self._get(cur, race)
        except Exception:
            if race is None:
                raise
            config = self.fetcher.config
            winner = race.settle(config.connect_timeout_s + config.read_timeout_s)
            if winner is None:
                raise
            assert winner.end is not None and winner.buf is not None
            # the part, completed with the winning hedge's bytes (those before them came from the original)
            base = cur.start - self.asked.start
            want = base + winner.end
            buf = self._buffer(want)
            n = winner.end - winner.offset
            memoryview(buf)[base + winner.offset : want] = memoryview(winner.buf)[:n]
            self.got = want
            return Part(buf, want, pooled=True)
        finally:
            if race is not None:
                race.close()

    def _buffer(self, want: int) -> Buffer:
        if self.buf is None:
            self.buf = self.fetcher.buffer(want)
        return self.buf

    def _race(self, cur: ByteRange) -> Race | None:
        """The race of one attempt (None: not hedged)."""
        f = self.fetcher
        if f.policy is None or not f.io.abortable:
            return None
        sized = self.sized

        def hedge(race: Race, runner: Runner) -> None:
            run_hedge(race, runner, cur, f.io, f.state, sized, _is_throttle)

        race = f.runtime.hedging.race(f.policy, cur.length, hedge, f.group, baseline=self.baseline)
        self.baseline = race.baseline
        return race

    def _get(self, cur: ByteRange, race: Race | None) -> Part:
        """One GET of ``cur`` (the bytes of ``asked`` after ``got``), read into the part's buffer."""
        f, asked, state, stats = self.fetcher, self.asked, self.fetcher.state, self.fetcher.runtime.stats
        got = self.got
        runner = race.primary if race is not None else None
        started, sent_at = f.clock(), time.monotonic()
        try:
            body = f.io.get(state.headers(cur), abort=runner.abort if runner is not None else None)
        except BadResponse as exc:
            if self.first and exc.failure.status == 416:
                raise PastEnd() from None
            raise
        latency = f.clock() - started
        head_at = time.monotonic()
        if runner is not None:
            runner.head_at = runner.progress_at = head_at
        try:
            status = body.status
            check = check_response(status, body.content_range, body.content_length, cur, state.size)
            if check.verdict is Verdict.BAD:
                raise BadResponse(Failure(Fault.BAD_RANGE, status, check.reason))
            assert check.total is not None
            state.learn(check.total, body.etag)
            end = min(asked.end, check.total)
            if check.verdict is Verdict.WHOLE:
                if check.total > WHOLE_OBJECT_MAX_BYTES:
                    raise S3Error(
                        f"{state.url}: the server answered a ranged GET with the whole object "
                        f"({check.total:,} bytes, over the {WHOLE_OBJECT_MAX_BYTES:,} fastload holds in "
                        "memory): it does not serve byte ranges; serve the file from a server that does "
                        "(any S3 store, nginx, a CDN), or download it whole with another tool",
                        bucket=state.bucket,
                        key=state.key,
                        url=state.object_url,
                    )
                whole = _read_whole(body, check.total)
                stats.request_done(latency, len(whole))
                state.whole = whole
                return Part(bytes(whole[asked.start : end]), max(0, end - asked.start))
            want = end - asked.start
            if self.sized is not None:
                self.sized.set()

            def progress(n: int, now: float) -> None:
                self.got += n
                if runner is not None:
                    runner.got, runner.progress_at = self.got - got, now

            try:
                _, gap = fill(body, memoryview(self._buffer(want))[got:want], head_at, progress)
            finally:
                stats.request_done(latency, self.got - got)
            if self.got < want:
                why = f"body ended after {self.got - got} of {end - cur.start} bytes"
                raise BadResponse(Failure(Fault.SHORT_BODY, status, why))
            if overlong(body):
                raise BadResponse(Failure(Fault.BAD_RANGE, status, "body longer than its range"))
            if race is not None and not race.claim(race.primary):
                raise Lost()  # a hedge finished first: its bytes are taken (they are the same)
            f.runtime.hedging.observe(want - got, head_at - sent_at, time.monotonic() - sent_at, gap)
            assert self.buf is not None
            return Part(self.buf, want, pooled=True)
        finally:
            body.close()


def _read_whole(body: Body, size: int) -> memoryview:
    """A 200's whole-object body, read into one buffer."""
    view = memoryview(new_buffer(size)) if size else memoryview(b"")
    got, _ = fill(body, view)
    if got != size:
        raise BadResponse(Failure(Fault.SHORT_BODY, 200, f"whole-object body has {got} of {size} bytes"))
    return view


def _is_throttle(exc: Exception) -> bool:
    """Whether a failed GET was throttled by S3 (a 503 SlowDown, a throttling error code)."""
    failure = exc.failure if isinstance(exc, BadResponse) else classify_exception(exc)
    return failure is not None and failure.fault is Fault.THROTTLE
