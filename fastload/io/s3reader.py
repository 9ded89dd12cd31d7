"""The parallel ranged-GET reader: a seekable, read-only binary file over one S3 object.

Parts of ``part_size_bytes`` are fetched concurrently (up to ``max_concurrency`` per reader, and the
process-wide AIMD gate across readers) with ``Range`` and ``If-Match``; every response is checked against
the range contract (``core.ranges``); failures are retried per range by ``core.retry`` (resuming after the
last good byte); a part is handed to the reader only when complete and correct.
"""

from __future__ import annotations

import bisect
import io
import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from fastload.config import S3Config
from fastload.core.ranges import ByteRange, Verdict, check_response
from fastload.core.retry import Fault
from fastload.errors import ObjectChangedError, RangeReadError
from fastload.io.retrying import BadResponse, Retrier
from fastload.io.s3client import Failure, classify_exception, fail_fast_error, get_client
from fastload.io.s3stats import STATS

T = TypeVar("T")
_CHUNK = 1 << 20
FIRST_PART_BYTES = 1 << 20


class _Part:
    """A part's bytes as the chunks they arrived in (never joined: bytes are copied once, to the caller)."""

    __slots__ = ("chunks", "ends", "size")

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.ends = list(itertools.accumulate(len(c) for c in chunks))
        self.size = self.ends[-1] if self.ends else 0

    def __len__(self) -> int:
        return self.size

    def views(self, offset: int, n: int) -> Iterator[memoryview]:
        """Memoryviews covering ``[offset, offset + n)``."""
        i = bisect.bisect_right(self.ends, offset)
        while n > 0:
            start = self.ends[i] - len(self.chunks[i])
            a = offset - start
            take = min(n, len(self.chunks[i]) - a)
            yield memoryview(self.chunks[i])[a : a + take]
            offset += take
            n -= take
            i += 1


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
        self._client = client if client is not None else get_client(self._config)
        self._version_id = version_id
        self._rng, self._sleep, self._clock = rng or random.Random(), sleep, clock
        self._retrier = Retrier.from_config(self._config, rng=self._rng, sleep=sleep, clock=clock)
        self._pid = os.getpid()
        self._part = self._config.part_size_bytes
        # a small first part: its answer (size, ETag) arrives quickly and lets every other part start
        self._first = min(self._part, FIRST_PART_BYTES)
        self._window = self._config.readahead_parts
        self._lock = threading.Lock()
        self._size: int | None = None
        self._etag: str | None = None
        self._whole: bytes | None = None
        self._parts: dict[int, Future[_Part]] = {}
        self._stops: dict[int, threading.Event] = {}
        self._closing = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._pos = 0

    def _after_fork(self) -> None:
        """In a forked child (a DataLoader worker), drop the parent's threads, client and gate."""
        pid = os.getpid()
        if pid == self._pid:
            return
        self._pid = pid
        self._client = get_client(self._config)
        self._retrier = Retrier.from_config(self._config, rng=self._rng, sleep=self._sleep, clock=self._clock)
        self._parts = {i: f for i, f in self._parts.items() if f.done() and f.exception() is None}
        self._stops = {}
        self._pool = None

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
            self._retain(self._index_of(pos))
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
                view[got : got + n] = memoryview(self._whole)[self._pos : self._pos + n]
            else:
                index = self._index_of(self._pos)
                self._retain(index)
                part = self._parts[index].result()
                offset = self._pos - self._range_of(index).start
                n = min(len(view) - got, len(part) - offset)
                at = got
                for piece in part.views(offset, n):
                    view[at : at + len(piece)] = piece
                    at += len(piece)
            self._pos += n
            got += n
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
            out = self._whole[self._pos : self._pos + size]
            self._pos += len(out)
            return out
        pieces: list[memoryview] = []
        left = size
        while left:
            index = self._index_of(self._pos)
            self._retain(index)
            part = self._parts[index].result()
            offset = self._pos - self._range_of(index).start
            take = min(left, len(part) - offset)
            pieces.extend(part.views(offset, take))
            self._pos += take
            left -= take
        whole = pieces[0].obj if len(pieces) == 1 else None
        if isinstance(whole, bytes) and len(whole) == len(pieces[0]):
            return whole  # exactly one received chunk: no copy
        return b"".join(pieces)

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
            return self._whole[start - sum(len(p) for p in parts) : end]
        ranges = [ByteRange(a, min(a + self._part, end)) for a in range(start, end, self._part)]
        if len(ranges) == 1:
            parts.append(self._fetch(ranges[0], stop=stop))
        elif ranges:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self._config.max_concurrency, thread_name_prefix="fastload-s3"
                    )
                pool = self._pool
            futures = [pool.submit(self._fetch, r, stop=stop) for r in ranges]
            try:
                parts += [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        pieces = [piece for part in parts for piece in part.views(0, len(part))]
        data = pieces[0].obj if len(pieces) == 1 else None
        if isinstance(data, bytes) and len(data) == len(pieces[0]):
            return data
        return b"".join(pieces)

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
                fut.cancel()
            self._parts.clear()
            self._stops.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._whole = None
        super().close()

    # -- parts ----------------------------------------------------------------------------------------

    def _index_of(self, offset: int) -> int:
        """The part holding byte ``offset``: part 0 is ``[0, first)``, then parts of ``part_size_bytes``."""
        return 0 if offset < self._first else 1 + (offset - self._first) // self._part

    def _range_of(self, index: int, *, clip: bool = True) -> ByteRange:
        start = 0 if index == 0 else self._first + (index - 1) * self._part
        end = self._first if index == 0 else start + self._part
        if clip:
            assert self._size is not None
            end = min(end, self._size)
        return ByteRange(start, end)

    def _retain(self, index: int) -> None:
        """Keep parts ``index .. index+window-1`` scheduled; cancel or drop every other part."""
        assert self._size is not None
        if self._whole is not None:  # a 200 brought the whole object: parts still queued are useless
            for i in list(self._parts):
                self._parts.pop(i).cancel()
                stop = self._stops.pop(i, None)
                if stop is not None:
                    stop.set()
            return
        last = self._index_of(self._size - 1) if self._size else -1
        wanted = range(index, min(index + self._window, last + 1))
        for i in [i for i in self._parts if i not in wanted]:
            self._parts.pop(i).cancel()
            stop = self._stops.pop(i, None)
            if stop is not None:
                stop.set()  # a part already running stops retrying
        if self._pool is None and len(wanted) > 1:
            self._pool = ThreadPoolExecutor(
                max_workers=self._config.max_concurrency, thread_name_prefix="fastload-s3"
            )
        for i in wanted:
            if i not in self._parts:
                r = self._range_of(i)
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

    def _first_read(self, pos: int) -> None:
        """The first GET: learns size and ETag from its response, keeps its bytes as a part."""
        index = self._index_of(pos)
        asked = self._range_of(index, clip=False)
        try:
            data = self._fetch(asked, first=True)
        except _PastEnd:
            self._head()
            return
        if self._whole is None:
            fut: Future[_Part] = Future()
            fut.set_result(data)
            self._parts[index] = fut

    def _head(self) -> None:
        def attempt() -> None:
            params = self._params()
            started = self._clock()
            resp = self._client.head_object(**params)
            STATS.request_done(self._clock() - started, 0)
            self._learn(int(resp["ContentLength"]), resp.get("ETag"))

        self._retrying(attempt, ByteRange(0, 1), "HEAD")

    def _params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self.key}
        if self._version_id:
            params["VersionId"] = self._version_id
        elif self._etag:
            params["IfMatch"] = self._etag
        return params

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

    def _fetch(self, asked: ByteRange, *, first: bool = False, stop: threading.Event | None = None) -> _Part:
        """Bytes of ``asked`` (clipped to the object on the first request), retried until complete."""
        state: dict[str, Any] = {"chunks": [], "got": 0}

        def attempt() -> _Part:
            got = state["got"]
            cur = ByteRange(asked.start + got, asked.end)
            params = self._params()
            params["Range"] = cur.header()
            started = self._clock()
            try:
                resp = self._client.get_object(**params)
            except Exception as exc:
                failure = classify_exception(exc)
                if first and failure is not None and failure.status == 416:
                    raise _PastEnd() from None
                raise
            latency = self._clock() - started
            body = resp["Body"]
            try:
                status = int(resp["ResponseMetadata"]["HTTPStatusCode"])
                check = check_response(
                    status, resp.get("ContentRange"), resp.get("ContentLength"), cur, self._size
                )
                if check.verdict is Verdict.BAD:
                    raise BadResponse(Failure(Fault.BAD_RANGE, status, check.reason))
                assert check.total is not None
                self._learn(check.total, resp.get("ETag"))
                if check.verdict is Verdict.WHOLE:
                    whole = _read_body(body, check.total)
                    STATS.request_done(latency, len(whole))
                    self._whole = whole
                    end = min(asked.end, check.total)
                    return _Part([whole[asked.start : end]])
                end = min(asked.end, check.total)
                want = end - asked.start
                chunks: list[bytes] = state["chunks"]
                read = _chunk_reader(body)
                try:
                    while state["got"] < want:
                        chunk = read(min(_CHUNK, want - state["got"]))
                        if not chunk:
                            break
                        chunks.append(chunk)
                        state["got"] += len(chunk)
                finally:
                    STATS.request_done(latency, state["got"] - got)
                if state["got"] < want:
                    raise BadResponse(
                        Failure(
                            Fault.SHORT_BODY,
                            status,
                            f"body ended after {state['got'] - got} of {end - cur.start} bytes",
                        )
                    )
                if state["got"] > want or read(1):
                    raise BadResponse(Failure(Fault.BAD_RANGE, status, "body longer than its range"))
                return _Part(chunks)
            finally:
                body.close()

        return self._retrying(attempt, asked, "GET", stop=stop)

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


def _chunk_reader(body: Any) -> Callable[[int], bytes]:
    """A function returning the bytes that have arrived (up to n) without waiting for all n, so that a
    stalled body loses nothing already received (urllib3's ``read1``); botocore's ``read`` otherwise."""
    raw = getattr(body, "_raw_stream", None)
    read1 = getattr(raw, "read1", None)
    return read1 if callable(read1) else body.read  # type: ignore[no-any-return]


class _PastEnd(Exception):
    """416 on the first request: the read position is at or past the end of the object."""


def _read_body(body: Any, size: int) -> bytes:
    data = body.read()
    if len(data) != size:
        raise BadResponse(
            Failure(Fault.SHORT_BODY, 200, f"whole-object body has {len(data)} of {size} bytes")
        )
    return bytes(data)
