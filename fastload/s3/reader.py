"""The parallel ranged-GET reader: a seekable, read-only binary file over one S3 object.

Parts of ``part_size_bytes`` (cut by ``core.ranges.PartLayout``, a small first part then full ones) are
fetched concurrently (up to ``max_concurrency`` per reader, and the process-wide AIMD gate across readers)
with ``Range`` and ``If-Match``; every response is checked against the range contract (``core.ranges``);
failures are retried per range by ``core.retry`` (resuming after the last good byte); a part is handed to
the reader only when complete and correct. Requests travel over the transport ``S3Config.transport`` names
(``s3.transport``); each part's body is read straight into its own buffer. Each GET attempt is a race
(``s3.hedging``, policy in ``core.hedge``): one that lags far behind what its size predicts gets a hedge,
a second GET for its remaining bytes on a new connection, checked like any answer; the first to finish wins.

(Over 400 lines on purpose: one class whose read-ahead window, first-request handshake and per-part retries
share the object's state (size, ETag, parts in flight); split apart, they would reach into each other.)
"""

from __future__ import annotations

import io
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from fastload.config import S3Config
from fastload.core.hedge import HedgePolicy, split_range
from fastload.core.ranges import ByteRange, PartLayout, Verdict, check_response, plan_ranges
from fastload.core.retry import Fault
from fastload.errors import ObjectChangedError, RangeReadError
from fastload.s3 import runtime
from fastload.s3.client import Failure, classify_exception, fail_fast_error, get_client
from fastload.s3.hedging import Abort, Race, RaceGroup, Runner
from fastload.s3.partbuffers import Buffer, new_buffer
from fastload.s3.retrying import BadResponse, Retrier
from fastload.s3.transport import Body, BotocoreObject, ObjectIO, open_object

T = TypeVar("T")
FIRST_PART_BYTES = 1 << 20


def hedge_policy(config: S3Config) -> HedgePolicy | None:
    """The deadlines and hedge budget ``config`` asks for (None: no hedging)."""
    if config.hedge <= 0:
        return None
    ceiling = config.read_timeout_s
    return HedgePolicy(
        floor_s=min(config.hedge_floor_s, ceiling), ceiling_s=ceiling, max_fraction=config.hedge
    )


class _Part:
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


class RangedReader(io.RawIOBase):
    """Read-only, seekable view of ``s3://bucket/key``; see :class:`~fastload.config.S3Config` for the
    memory bound. Use :func:`fastload.open` rather than constructing it directly."""

    def __init__(
        self,
        bucket: str,
        key: str,
        *,
        config: S3Config | None = None,
        client: Any = None,
        version_id: str | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.bucket, self.key = bucket, key
        self._config = config or S3Config()
        self._runtime = runtime.current()  # this process's gate, part buffers and counters
        self._own_client = client
        self._client = client if client is not None else get_client(self._config)
        self._version_id = version_id
        self._object = self._open_object()
        self._rng, self._sleep, self._clock = rng or random.Random(), sleep, clock
        self._retrier = Retrier.from_config(self._config, rng=self._rng, sleep=sleep, clock=clock)
        self._hedge = hedge_policy(self._config)
        self._race_group = RaceGroup()  # this reader's GETs, for the hedging watchdog
        self._pid = os.getpid()
        self._part = self._config.part_size_bytes
        # a small first part: its answer (size, ETag) arrives quickly and lets every other part start
        self._first = min(self._part, FIRST_PART_BYTES)
        self._layout = PartLayout(self._part, self._first)
        self._window = self._config.readahead_parts
        self._lock = threading.Lock()
        self._size: int | None = None
        self._etag: str | None = None
        self._whole: memoryview | None = None
        self._parts: dict[int, Future[_Part]] = {}
        self._stops: dict[int, threading.Event] = {}
        self._spent: list[Future[_Part]] = []  # dropped parts whose buffers may still be viewed
        self._closing = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._pos = 0

    def _after_fork(self) -> None:
        """In a forked child (a DataLoader worker), drop the parent's threads, client and gate."""
        pid = os.getpid()
        if pid == self._pid:
            return
        self._pid = pid
        self._runtime = runtime.current()
        self._client = self._own_client if self._own_client is not None else get_client(self._config)
        self._object = self._open_object()
        self._retrier = Retrier.from_config(self._config, rng=self._rng, sleep=self._sleep, clock=self._clock)
        self._parts = {i: f for i, f in self._parts.items() if f.done() and f.exception() is None}
        self._stops = {}
        self._pool = None

    def _open_object(self) -> ObjectIO:
        """The transport for this object: ``config.transport``'s, or botocore for a client passed in."""
        if self._own_client is not None:
            return BotocoreObject(self._own_client, self.bucket, self.key, self._version_id)
        return open_object(self._config, self.bucket, self.key, self._version_id)

    def __repr__(self) -> str:
        return f"RangedReader('s3://{self.bucket}/{self.key}')"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    # -- io.RawIOBase ---------------------------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    @property
    def size(self) -> int:
        """Object size in bytes (asks the store once if no byte has been read yet)."""
        if self._size is None:
            self._after_fork()
            self._head()
        assert self._size is not None
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        self._after_fork()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        if self._size is not None:
            self._retain(self._layout.index_of(pos))
        return pos

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` (fewer bytes only at the end of the object), copying once out of the parts."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        self._after_fork()
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        if self._size is None:
            self._first_read(self._pos)
        assert self._size is not None
        got = 0
        while got < len(view) and self._pos < self._size:
            if self._whole is not None:
                n = min(len(view) - got, self._size - self._pos)
                view[got : got + n] = self._whole[self._pos : self._pos + n]
            else:
                index = self._layout.index_of(self._pos)
                self._retain(index)
                part = self._parts[index].result()
                offset = self._pos - self._layout.start_of(index)
                n = min(len(view) - got, len(part) - offset)
                view[got : got + n] = part.view(offset, n)
            self._pos += n
            got += n
        self._recycle(self._spent)
        return got

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all remaining when negative), copied once out of the fetched parts."""
        if size is None or size < 0:
            return self.readall()
        if self.closed:
            raise ValueError("I/O operation on closed file")
        self._after_fork()
        if size == 0:
            return b""
        if self._size is None:
            self._first_read(self._pos)
        assert self._size is not None
        size = min(size, self._size - self._pos)
        if size <= 0:
            return b""
        if self._whole is not None:
            out = bytes(self._whole[self._pos : self._pos + size])
            self._pos += len(out)
            return out
        pieces: list[memoryview] = []
        left = size
        while left:
            index = self._layout.index_of(self._pos)
            self._retain(index)
            part = self._parts[index].result()
            offset = self._pos - self._layout.start_of(index)
            take = min(left, len(part) - offset)
            pieces.append(part.view(offset, take))
            self._pos += take
            left -= take
        out = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
        del pieces
        self._recycle(self._spent)
        return out

    def fetch_range(self, start: int, end: int, *, stop: threading.Event | None = None) -> bytes:
        """Bytes ``[start, end)`` fetched now as concurrent parts: no readahead, no read position, safe to
        call from several threads. No HEAD: on an object not read yet, the range's first part goes alone and
        its answer gives size and ETag (every later request carries If-Match). Clipped to the object's
        end."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        self._after_fork()
        if end <= start:
            return b""
        parts: list[_Part] = []
        if self._size is None:  # the first part alone: its answer gives size and ETag to the others
            try:
                parts.append(
                    self._fetch(ByteRange(start, min(start + self._part, end)), first=True, stop=stop)
                )
            except _PastEnd:
                return b""
            start += len(parts[0])
        assert self._size is not None
        end = min(end, self._size)
        if self._whole is not None:
            return bytes(self._whole[start - sum(len(p) for p in parts) : end])
        ranges = plan_ranges(end, self._part, start=start) if start < end else []
        if len(ranges) == 1:
            parts.append(self._fetch(ranges[0], stop=stop))
        elif ranges:
            pool = self._ensure_pool()
            futures = [pool.submit(self._fetch, r, stop=stop) for r in ranges]
            try:
                parts += [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        pieces = [part.view(0, len(part)) for part in parts]
        out = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
        del pieces
        done: list[Future[_Part]] = []
        for part in parts:
            fut: Future[_Part] = Future()
            fut.set_result(part)
            done.append(fut)
        self._recycle(done)
        return out

    def readall(self) -> bytes:
        out = bytearray()
        while True:
            chunk = self.read(max(self._part, 1))
            if not chunk:
                return bytes(out)
            out += chunk

    def close(self) -> None:
        if not self.closed:
            self._closing.set()
            for stop in self._stops.values():
                stop.set()
            for fut in self._parts.values():
                self._drop(fut)
            self._parts.clear()
            self._recycle(self._spent)
            self._stops.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._whole = None
        super().close()

    # -- parts ----------------------------------------------------------------------------------------

    def _retain(self, index: int) -> None:
        """Keep parts ``index .. index+window-1`` scheduled; cancel or drop every other part."""
        assert self._size is not None
        if self._whole is not None:  # a 200 brought the whole object: parts still queued are useless
            for i in list(self._parts):
                self._drop(self._parts.pop(i))
                stop = self._stops.pop(i, None)
                if stop is not None:
                    stop.set()
            return
        last = self._layout.last_index(self._size)
        wanted = range(index, min(index + self._window, last + 1))
        for i in [i for i in self._parts if i not in wanted]:
            self._drop(self._parts.pop(i))
            stop = self._stops.pop(i, None)
            if stop is not None:
                stop.set()  # a part already running stops retrying
        if self._pool is None and len(wanted) > 1:
            self._ensure_pool()
        for i in wanted:
            if i not in self._parts:
                r = self._layout.range_of(i, self._size)
                if self._pool is None:
                    fut: Future[_Part] = Future()
                    try:
                        fut.set_result(self._fetch(r))
                    except BaseException as exc:
                        fut.set_exception(exc)
                    self._parts[i] = fut
                else:
                    stop = self._stops[i] = threading.Event()
                    self._parts[i] = self._pool.submit(self._fetch, r, stop=stop)

    def _drop(self, fut: Future[_Part]) -> None:
        """Cancel a part no longer wanted; a finished one's buffer is recycled by :meth:`_recycle`."""
        if not fut.cancel() and fut.done():
            self._spent.append(fut)

    def _recycle(self, futures: list[Future[_Part]]) -> None:
        """Hand the buffers of finished, dropped parts to the process pool (no view of them may remain)."""
        cap = (self._window + 1) * self._part  # the reader's own memory bound
        pool = self._runtime.buffers
        for fut in futures:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                part = fut.result()
                if part.pooled:
                    pool.give(part.buf, cap)  # type: ignore[arg-type]
        futures.clear()

    def _first_read(self, pos: int) -> None:
        """The first GET: learns size and ETag from its response, keeps its bytes as a part. With a window
        of several parts it runs on the pool and returns once its response head has given size and ETag, so
        the other parts start while its body still streams (a 200 with the whole object is awaited)."""
        index = self._layout.index_of(pos)
        asked = self._layout.range_of(index)
        if self._window > 1:
            sized = threading.Event()
            fut = self._ensure_pool().submit(self._fetch, asked, first=True, sized=sized)
            fut.add_done_callback(lambda _: sized.set())  # a failure or a whole-object 200 wakes us too
            sized.wait()
            if fut.done():
                try:
                    fut.result()
                except _PastEnd:
                    self._head()
                    return
            if self._whole is None:
                self._parts[index] = fut
            return
        try:
            data = self._fetch(asked, first=True)
        except _PastEnd:
            self._head()
            return
        if self._whole is None:
            done: Future[_Part] = Future()
            done.set_result(data)
            self._parts[index] = done

    def _ensure_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._config.max_concurrency, thread_name_prefix="fastload-s3"
                )
            return self._pool

    def _head(self) -> None:
        def attempt() -> None:
            started = self._clock()
            body = self._object.head(self._headers())
            body.close()
            self._runtime.stats.request_done(self._clock() - started, 0)
            if body.content_length is None:
                raise BadResponse(Failure(Fault.BAD_RANGE, body.status, "HEAD answer without Content-Length"))
            self._learn(int(body.content_length), body.etag)

        self._retrying(attempt, ByteRange(0, 1), "HEAD")

    def _headers(self, byte_range: ByteRange | None = None) -> dict[str, str]:
        """Range and If-Match (once the ETag is known; a pinned version needs none)."""
        headers = {"Range": byte_range.header()} if byte_range is not None else {}
        if self._etag and not self._version_id:
            headers["If-Match"] = self._etag
        return headers

    def _learn(self, size: int, etag: str | None) -> None:
        with self._lock:
            if self._etag is not None and etag is not None and etag != self._etag:
                raise ObjectChangedError(
                    f"{self.url} changed while being read (ETag {self._etag} became {etag}); open it again "
                    "to read the new version",
                    bucket=self.bucket,
                    key=self.key,
                )
            if self._size is not None and size != self._size:
                raise ObjectChangedError(
                    f"{self.url} changed size while being read ({self._size} -> {size}); open it again",
                    bucket=self.bucket,
                    key=self.key,
                )
            self._size = size
            self._etag = self._etag or etag

    def _fetch(
        self,
        asked: ByteRange,
        *,
        first: bool = False,
        stop: threading.Event | None = None,
        sized: threading.Event | None = None,
    ) -> _Part:
        """Bytes of ``asked`` (clipped to the object on the first request), retried until complete; every
        retry asks only for the bytes after the last good one, read into the same buffer. ``sized`` is set
        once a ranged answer has given the object's size and ETag (before its body is read). Each attempt
        runs as a race (``s3.hedging``): if it lags, a hedge fetches its remaining bytes and may win."""
        state: dict[str, Any] = {"buf": None, "got": 0, "baseline": None}

        def attempt() -> _Part:
            cur = ByteRange(asked.start + state["got"], asked.end)
            race = self._race(cur, sized, state)
            try:
                return self._get(asked, cur, state, race, first=first, sized=sized)
            except Exception:
                if race is None:
                    raise
                winner = race.settle(self._config.connect_timeout_s + self._config.read_timeout_s)
                if winner is None:
                    raise
                return self._merged(asked, cur, state, winner)
            finally:
                if race is not None:
                    race.close()

        return self._retrying(attempt, asked, "GET", stop=stop)

    def _race(self, cur: ByteRange, sized: threading.Event | None, state: dict[str, Any]) -> Race | None:
        """The race of one attempt (None: not hedged); ``state["baseline"]``: the first attempt's race's."""
        if self._hedge is None or not self._object.abortable:
            return None
        race = self._runtime.hedging.race(
            self._hedge,
            cur.length,
            lambda race, runner: self._hedged(race, runner, cur, sized),
            self._race_group,
            baseline=state["baseline"],
        )
        state["baseline"] = race.baseline
        return race

    def _buffer(self, want: int) -> Buffer:
        # parts of one size class share pooled buffers: a short last part uses a whole one
        return self._runtime.buffers.take(self._part if self._first < want <= self._part else want)

    def _get(
        self,
        asked: ByteRange,
        cur: ByteRange,
        state: dict[str, Any],
        race: Race | None,
        *,
        first: bool,
        sized: threading.Event | None,
    ) -> _Part:
        """One GET of ``cur`` (the bytes of ``asked`` after ``state["got"]``), read into the part's buffer."""
        got = state["got"]
        runner = race.primary if race is not None else None
        started, sent_at = self._clock(), time.monotonic()
        try:
            body = self._object.get(self._headers(cur), abort=runner.abort if runner is not None else None)
        except BadResponse as exc:
            if first and exc.failure.status == 416:
                raise _PastEnd() from None
            raise
        latency = self._clock() - started
        head_at = time.monotonic()
        if runner is not None:
            runner.head_at = runner.progress_at = head_at
        try:
            status = body.status
            check = check_response(status, body.content_range, body.content_length, cur, self._size)
            if check.verdict is Verdict.BAD:
                raise BadResponse(Failure(Fault.BAD_RANGE, status, check.reason))
            assert check.total is not None
            self._learn(check.total, body.etag)
            if check.verdict is Verdict.WHOLE:
                whole = _read_whole(body, check.total)
                self._runtime.stats.request_done(latency, len(whole))
                self._whole = whole
                end = min(asked.end, check.total)
                return _Part(bytes(whole[asked.start : end]), max(0, end - asked.start))
            end = min(asked.end, check.total)
            want = end - asked.start
            if sized is not None:
                sized.set()
            if state["buf"] is None:
                state["buf"] = self._buffer(want)
            view = memoryview(state["buf"])
            last, gap = head_at, 0.0
            try:
                while state["got"] < want:
                    n = body.readinto(view[state["got"] : want])
                    if not n:
                        break
                    state["got"] += n
                    now = time.monotonic()
                    last, gap = now, max(gap, now - last)
                    if runner is not None:
                        runner.got, runner.progress_at = state["got"] - got, now
            finally:
                self._runtime.stats.request_done(latency, state["got"] - got)
            if state["got"] < want:
                raise BadResponse(
                    Failure(
                        Fault.SHORT_BODY,
                        status,
                        f"body ended after {state['got'] - got} of {end - cur.start} bytes",
                    )
                )
            if body.readinto(memoryview(bytearray(1))):
                raise BadResponse(Failure(Fault.BAD_RANGE, status, "body longer than its range"))
            if race is not None and not race.claim(race.primary):
                raise _Lost()  # a hedge finished first: its bytes are taken (they are the same)
            self._runtime.hedging.observe(want - got, head_at - sent_at, time.monotonic() - sent_at, gap)
            return _Part(state["buf"], want, pooled=True)
        finally:
            body.close()

    def _hedged(self, race: Race, runner: Runner, cur: ByteRange, sized: threading.Event | None) -> None:
        """A hedge (on its own thread): the bytes of ``cur`` from ``runner.offset`` on, over new connections
        (``runner.pieces`` concurrent ranges, once the object's size is known), into a buffer of its own,
        every answer checked like any response (206, Content-Range, If-Match); claims the race if it has
        them all first. Its failures only end the hedge: the original GET decides the error."""
        start, size = cur.start + runner.offset, self._size
        end = cur.end if size is None else min(cur.end, size)
        if start >= end:
            return
        ranges = split_range(ByteRange(start, end), runner.pieces if size is not None else 1)
        whole = memoryview(new_buffer(end - start)) if size is not None else None
        lock, heads = threading.Lock(), [0]

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

        def progressed(n: int) -> None:
            with lock:
                runner.got += n
                runner.progress_at = time.monotonic()

        def piece(i: int) -> None:
            abort = runner.abort if len(ranges) == 1 else runner.abort.child()
            results[i] = self._hedge_piece(ranges[i], abort, into, sized, headed, progressed)
            if results[i] is None:
                runner.abort.fire()  # one range failed: the hedge has lost, its other ranges stop

        results: list[tuple[int, float, float, float] | None] = [None] * len(ranges)
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
            self._runtime.stats.hedge_event(failed=1)
            return
        runner.buf, runner.end = whole.obj, start + len(whole) - cur.start
        if race.claim(runner):
            for timing in results:
                if timing is not None:
                    self._runtime.hedging.observe(*timing)

    def _hedge_piece(
        self,
        asked: ByteRange,
        abort: Abort,
        into: Callable[[ByteRange, int], memoryview],
        sized: threading.Event | None,
        headed: Callable[[], None],
        progressed: Callable[[int], None],
    ) -> tuple[int, float, float, float] | None:
        """One GET of a hedge, on a new connection, its body read into ``into(asked, length)``: the
        ``observe`` figures (bytes, first byte, total, longest gap) once every byte of ``asked`` (clipped to
        the object) has come, None if not (a throttled answer holds hedging back)."""
        sent_at = time.monotonic()
        stats, got = self._runtime.stats, 0
        try:
            body = self._object.get(self._headers(asked), abort=abort, fresh=True)
        except Exception as exc:
            _hedge_throttled(stats, exc)
            return None
        head_at = last = time.monotonic()
        headed()
        try:
            check = check_response(body.status, body.content_range, body.content_length, asked, self._size)
            if check.verdict is not Verdict.PARTIAL or check.total is None:
                return None
            self._learn(check.total, body.etag)
            if sized is not None:
                sized.set()
            view, gap = into(asked, min(asked.end, check.total) - asked.start), 0.0
            while got < len(view):
                n = body.readinto(view[got:])
                if not n:
                    break
                got += n
                now = time.monotonic()
                last, gap = now, max(gap, now - last)
                progressed(n)
            if got < len(view) or body.readinto(memoryview(bytearray(1))):
                return None
            return got, head_at - sent_at, time.monotonic() - sent_at, gap
        except Exception as exc:
            _hedge_throttled(stats, exc)
            return None
        finally:
            body.close()
            stats.request_done(head_at - sent_at, got)

    def _merged(self, asked: ByteRange, cur: ByteRange, state: dict[str, Any], winner: Runner) -> _Part:
        """The part, completed with the winning hedge's bytes (those before them came from the original)."""
        assert winner.end is not None and winner.buf is not None
        base = cur.start - asked.start
        n = winner.end - winner.offset
        want = base + winner.end
        if state["buf"] is None:
            state["buf"] = self._buffer(want)
        memoryview(state["buf"])[base + winner.offset : want] = memoryview(winner.buf)[:n]
        state["got"] = want
        return _Part(state["buf"], want, pooled=True)

    def _retrying(
        self, attempt: Callable[[], T], asked: ByteRange, verb: str, *, stop: threading.Event | None = None
    ) -> T:
        def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
            if failure.fault is Fault.CHANGED:
                return ObjectChangedError(
                    f"{self.url} was overwritten while being read ({failure.message} on If-Match "
                    f"{self._etag}); open it again to read the new version",
                    bucket=self.bucket,
                    key=self.key,
                )
            if failure.fault in (Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT):
                return fail_fast_error(failure, self.bucket, self.key)
            end = asked.end if self._size is None else min(asked.end, self._size)
            return RangeReadError(
                bucket=self.bucket,
                key=self.key,
                start=asked.start,
                end=max(end, asked.start + 1),
                attempts=tries,
                elapsed_s=elapsed_s,
                last_error=f"{verb}: {failure.message}",
                cause=failure.fault.value,
            )

        return self._retrier.call(attempt, give_up, stop=stop or self._closing)


class _PastEnd(Exception):
    """416 on the first request: the read position is at or past the end of the object."""


class _Lost(Exception):
    """The original GET finished after a hedge had won."""


def _hedge_throttled(stats: Any, exc: Exception) -> None:
    """A hedge's GET failed: if throttled, the watchdog holds back (``core.hedge``)."""
    failure = exc.failure if isinstance(exc, BadResponse) else classify_exception(exc)
    if failure is not None and failure.fault is Fault.THROTTLE:
        stats.throttled()


def _read_whole(body: Body, size: int) -> memoryview:
    """A 200's whole-object body, read into one buffer."""
    view = memoryview(new_buffer(size)) if size else memoryview(b"")
    got = 0
    while got < size:
        n = body.readinto(view[got:])
        if not n:
            break
        got += n
    if got != size:
        raise BadResponse(Failure(Fault.SHORT_BODY, 200, f"whole-object body has {got} of {size} bytes"))
    return view
