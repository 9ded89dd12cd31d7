"""The parallel ranged-GET reader: a seekable, read-only binary file over one S3 object.

It keeps the read-ahead window and the file API (``read``, ``readinto``, ``seek``, ``fetch_range``): parts
of ``part_size_bytes`` (cut by ``core.ranges.PartLayout``, a small first part then full ones) are fetched
concurrently (up to ``max_concurrency`` per reader, and the process-wide AIMD gate across readers), each by
a :class:`~fastload.s3.partfetch.PartFetch` (``Range`` and ``If-Match``, checked against the range contract,
retried from the last good byte, raced against hedges: ``s3.partfetch``, ``s3.races``); a part is handed to
the reader only when complete and correct. The first request's answer gives size and ETag
(:class:`~fastload.s3.objectio.ObjectState`), and every later request carries If-Match. Requests travel
over the transport ``S3Config.transport`` names (``s3.transport``, behind ``s3.objectio``'s interface).
"""

from __future__ import annotations

import io
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from fastload.config import S3Config
from fastload.core.ranges import ByteRange, PartLayout, plan_ranges
from fastload.s3 import runtime
from fastload.s3.client import get_client
from fastload.s3.objectio import ObjectIO, ObjectState
from fastload.s3.partfetch import Fetcher, Part, PastEnd
from fastload.s3.races import RaceGroup
from fastload.s3.retrying import Retrier
from fastload.s3.transport import BotocoreObject, open_object

FIRST_PART_BYTES = 1 << 20


class RangedReader(io.RawIOBase):
    """Read-only, seekable view of ``s3://bucket/key`` (or of ``url``, whose transport ``store`` makes:
    another store's object); see :class:`~fastload.config.S3Config` for the memory bound. Use
    :func:`fastload.open` rather than constructing it directly."""

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
        store: Callable[[], ObjectIO] | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__()
        self.bucket, self.key = bucket, key
        self._config = config or S3Config()
        self._runtime = runtime.current()  # this process's gate, part buffers and counters
        self._own_client = client
        self._store, self._url = store, url  # another store's transport (made again after fork), its URL
        self._client = client if client is not None or store is not None else get_client(self._config)
        self._version_id = version_id
        self._object = self._open_object()
        self._rng, self._sleep, self._clock = rng or random.Random(), sleep, clock
        self._state = ObjectState(bucket, key, version_id, url=url)  # size, ETag, a whole-object answer
        self._race_group = RaceGroup()  # this reader's GETs, for the hedging watchdog
        self._pid = os.getpid()
        self._part = self._config.part_size_bytes
        # a small first part: its answer (size, ETag) arrives quickly and lets every other part start
        self._first = min(self._part, FIRST_PART_BYTES)
        self._layout = PartLayout(self._part, self._first)
        self._window = self._config.readahead_parts
        self._lock = threading.Lock()
        self._parts: dict[int, Future[Part]] = {}
        self._stops: dict[int, threading.Event] = {}
        self._spent: list[Future[Part]] = []  # dropped parts whose buffers may still be viewed
        self._closing = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._pos = 0
        self._fetcher = self._new_fetcher()

    def _after_fork(self) -> None:
        """In a forked child (a DataLoader worker), drop the parent's threads, client and gate."""
        pid = os.getpid()
        if pid == self._pid:
            return
        self._pid = pid
        self._runtime = runtime.current()
        if self._store is None:
            self._client = self._own_client if self._own_client is not None else get_client(self._config)
        self._object = self._open_object()
        self._fetcher = self._new_fetcher()
        self._parts = {i: f for i, f in self._parts.items() if f.done() and f.exception() is None}
        self._stops = {}
        self._pool = None

    def _open_object(self) -> ObjectIO:
        """The transport for this object: ``store``'s, ``config.transport``'s, or a client's passed in."""
        if self._store is not None:
            return self._store()
        if self._own_client is not None:
            return BotocoreObject(self._own_client, self.bucket, self.key, self._version_id)
        return open_object(self._config, self.bucket, self.key, self._version_id)

    def __repr__(self) -> str:
        return f"RangedReader({self.url!r})"

    @property
    def url(self) -> str:
        return self._url or f"s3://{self.bucket}/{self.key}"

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
        if self._state.size is None:
            self._after_fork()
            self._fetcher.head()
        assert self._state.size is not None
        return self._state.size

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
        if self._state.size is not None:
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
        if self._state.size is None:
            self._first_read(self._pos)
        assert self._state.size is not None
        got = 0
        while got < len(view) and self._pos < self._state.size:
            if self._state.whole is not None:
                n = min(len(view) - got, self._state.size - self._pos)
                view[got : got + n] = self._state.whole[self._pos : self._pos + n]
            else:
                index = self._layout.index_of(self._pos)
                part = self._part_at(index)
                if part is None:  # (the whole object came meanwhile)
                    continue
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
            size = sys.maxsize
        if self.closed:
            raise ValueError("I/O operation on closed file")
        self._after_fork()
        if size == 0:
            return b""
        if self._state.size is None:
            self._first_read(self._pos)
        assert self._state.size is not None
        size = min(size, self._state.size - self._pos)
        if size <= 0:
            return b""
        pieces: list[memoryview] = []
        left = size
        while left:
            if self._state.whole is not None:  # a 200 brought the whole object (also in the middle of this)
                take = left
                pieces.append(memoryview(self._state.whole)[self._pos : self._pos + take])
            else:
                index = self._layout.index_of(self._pos)
                part = self._part_at(index)
                if part is None:  # (the whole object came meanwhile)
                    continue
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
        parts: list[Part] = []
        if self._state.size is None:  # the first part alone: its answer gives size and ETag to the others
            try:
                parts.append(
                    self._fetch(ByteRange(start, min(start + self._part, end)), first=True, stop=stop)
                )
            except PastEnd:
                return b""
            start += len(parts[0])
        assert self._state.size is not None
        end = min(end, self._state.size)
        if self._state.whole is not None:
            return bytes(self._state.whole[start - sum(len(p) for p in parts) : end])
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
        done: list[Future[Part]] = []
        for part in parts:
            fut: Future[Part] = Future()
            fut.set_result(part)
            done.append(fut)
        self._recycle(done)
        return out

    def readall(self) -> bytes:
        """The rest of the object, copied once out of its parts."""
        return self.read(-1)

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
            self._state.whole = None
        super().close()

    # -- parts ----------------------------------------------------------------------------------------

    def _retain(self, index: int) -> None:
        """Keep parts ``index .. index+window-1`` scheduled; cancel or drop every other part."""
        assert self._state.size is not None
        if self._state.whole is not None:  # a 200 brought the whole object: parts still queued are useless
            for i in list(self._parts):
                self._drop(self._parts.pop(i))
                stop = self._stops.pop(i, None)
                if stop is not None:
                    stop.set()
            return
        last = self._layout.last_index(self._state.size)
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
                r = self._layout.range_of(i, self._state.size)
                if self._pool is None:
                    fut: Future[Part] = Future()
                    try:
                        fut.set_result(self._fetch(r))
                    except BaseException as exc:
                        fut.set_exception(exc)
                    self._parts[i] = fut
                else:
                    stop = self._stops[i] = threading.Event()
                    self._parts[i] = self._pool.submit(self._fetch, r, stop=stop)

    def _part_at(self, index: int) -> Part | None:
        """Part ``index``, the window scheduled from it (None: a 200 brought the whole object instead)."""
        self._retain(index)
        fut = self._parts.get(index)
        return None if fut is None else fut.result()

    def _drop(self, fut: Future[Part]) -> None:
        """Cancel a part no longer wanted; a finished one's buffer is recycled by :meth:`_recycle`."""
        if not fut.cancel() and fut.done():
            self._spent.append(fut)

    def _recycle(self, futures: list[Future[Part]]) -> None:
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
                except PastEnd:
                    self._fetcher.head()
                    return
            if self._state.whole is None:
                self._parts[index] = fut
            return
        try:
            data = self._fetch(asked, first=True)
        except PastEnd:
            self._fetcher.head()
            return
        if self._state.whole is None:
            done: Future[Part] = Future()
            done.set_result(data)
            self._parts[index] = done

    def _ensure_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._config.max_concurrency, thread_name_prefix="fastload-s3"
                )
            return self._pool

    def _fetch(self, asked: ByteRange, **how: Any) -> Part:
        """Range ``asked`` by this process's fetcher (``how``: :meth:`Fetcher.fetch`'s options)."""
        return self._fetcher.fetch(asked, **how)

    def _new_fetcher(self) -> Fetcher:
        """What this reader's part fetches share, in this process (after fork: its runtime, client)."""
        retrier = Retrier.from_config(self._config, rng=self._rng, sleep=self._sleep, clock=self._clock)
        return Fetcher(
            self._object,
            self._state,
            self._config,
            self._runtime,
            retrier,
            group=self._race_group,
            closing=self._closing,
            part=self._part,
            first=self._first,
            clock=self._clock,
        )
