"""Open shards for random access (:class:`~fastload.train.mapview.MapDataset`): each shard's sample table
fetched on first use and its file opened, both kept in a bounded LRU (:class:`ShardHandles`), so that a
sample costs one ranged read of its bytes.

A handle reads through the shard's format (:meth:`fastload.formats.ShardFormat.samples`) with the same
functions iteration uses: a local file (or the shard cache's copy) with ``pread``; an ``s3://`` shard with
the parallel ranged reader's ``fetch_range`` (retries, If-Match, Content-Range checks, hedging). A Parquet
shard on S3 is given :class:`RangeFile`, a file over the bytes already fetched: its footer once, then each
row group's byte range with one read, from which pyarrow decodes the group.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from fastload import formats
from fastload.core.index import ShardEntry
from fastload.core.lru import LRU
from fastload.core.randomaccess import spans
from fastload.errors import ConfigError, SampleChecksumError, VerifyError
from fastload.formats.shard import short_read
from fastload.storage import access as storage
from fastload.storage.rangedfile import RangedFile
from fastload.storage.tables import missing_shard

if TYPE_CHECKING:
    from fastload.train.view import DatasetView

RawSample = dict[str, Any]
FOOTER_BYTES = 64 << 10  # what pyarrow reads first from a Parquet file's end (its footer read size)


class RangeFile(RangedFile):
    """A read-only file of ``size`` bytes whose reads are served from byte ranges fetched ahead
    (:meth:`hold`), else fetched with ``read(offset, size)`` each (one ranged read). Keeps the tail
    (``FOOTER_BYTES``) and the last range held. Not thread safe (its shard's handle locks)."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, name: str) -> None:
        super().__init__(size, name)
        self._read = read
        self._tail: tuple[int, bytes] | None = None
        self._held: tuple[int, bytes] | None = None

    def hold(self, offset: int, size: int) -> None:
        """Fetch ``[offset, offset + size)`` now with one read; later reads inside it cost nothing."""
        self._held = (offset, self._read(offset, size))

    def _bytes_at(self, offset: int, n: int) -> bytes | memoryview:
        if self._tail is None and offset + n > self._size - FOOTER_BYTES:
            start = max(0, self._size - FOOTER_BYTES)
            self._tail = (start, self._read(start, self._size - start))
        for held in (self._held, self._tail):
            if held is not None and held[0] <= offset and offset + n <= held[0] + len(held[1]):
                return memoryview(held[1])[offset - held[0] : offset - held[0] + n]
        return self._read(offset, n)


def _pread(fd: int, name: str, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise short_read(name, size, offset)
    return data


def _fetch(fetch_range: Callable[[int, int], bytes], name: str, offset: int, size: int) -> bytes:
    data = fetch_range(offset, offset + size)
    if len(data) != size:
        raise short_read(name, size, offset)
    return data


class ShardHandle:
    """One shard open for random access: its full entry, its file (a local descriptor, or the S3 object's
    ranged reader) and its format's sample source. ``users`` counts callers between
    :meth:`ShardHandles.get` and :meth:`ShardHandles.put`; an evicted handle is closed when its last user
    is done, and a handle dropped unclosed closes its descriptor when collected."""

    def __init__(
        self,
        url: str,
        entry: ShardEntry,
        *,
        fd: int | None = None,
        reader: BinaryIO | None = None,
        cached: bool,
    ) -> None:
        self.url, self.entry, self.name, self.cached = url, entry, entry.name, cached
        self.lock = threading.Lock()  # Parquet: a row group held, then decoded, by one thread at a time
        self.range_file: RangeFile | None = None
        self._reader = reader
        self._closing = weakref.finalize(self, os.close, fd) if fd is not None else None
        fmt = formats.for_path(entry.name)
        if fmt is None:
            self.close()
            known = ", ".join(formats.names())
            raise ConfigError(f"{entry.name}: no shard format reads files named so (registered: {known})")
        if reader is not None:
            fetch_range = reader.fetch_range  # type: ignore[attr-defined]
            read: Callable[[int, int], bytes] = functools.partial(_fetch, fetch_range, entry.name)
            if entry.row_groups:
                self.range_file = RangeFile(read, entry.bytes, entry.name)
            file = cast(BinaryIO, self.range_file) if self.range_file is not None else reader
        else:
            assert fd is not None
            read = functools.partial(_pread, fd, entry.name)
            file = open(fd, "rb", closefd=False)  # noqa: SIM115 (the descriptor is closed by close())
        self._file = file
        try:
            self.source = fmt.samples(entry, read=read, file=file, fd=fd)
        except BaseException:
            self.close()
            raise
        self.users = 0
        self.evicted = False

    def load(self, positions: Sequence[int], columns: Sequence[str] | None) -> list[RawSample]:
        """The samples at ``positions`` (the I/O and the parsing, in this thread)."""
        return list(self.source.load(positions, columns, defer=True)())

    def close(self) -> None:
        try:
            if hasattr(self, "source"):
                self.source.close()
        finally:
            if hasattr(self, "_file"):
                self._file.close()
            if self._reader is not None:
                self._reader.close()
            if self._closing is not None:
                self._closing()


def read_spans(
    handle: ShardHandle,
    positions: Sequence[int],
    columns: Sequence[str] | None,
    max_gap_bytes: int,
    *,
    skip: bool,
) -> dict[int, RawSample | SampleChecksumError]:
    """The samples at ``positions`` (ascending, distinct) of ``handle``'s shard, read by spans of
    neighbours at most ``max_gap_bytes`` apart (:func:`~fastload.core.randomaccess.spans`). A damaged
    sample (its bytes fail their CRC32C) that is not one of them, read along, is read around; so, with
    ``skip``, is one of them, which then maps to its :class:`SampleChecksumError`."""
    entry = handle.entry
    out: dict[int, RawSample | SampleChecksumError] = {}
    want = set(positions)
    todo = spans(positions, entry.offsets, entry.sizes, max_gap_bytes=max_gap_bytes)[::-1]
    while todo:
        first, stop = todo.pop()
        try:
            for raw in handle.load(range(first, stop), columns):
                if raw["__index__"] in want:
                    out[raw["__index__"]] = raw
        except SampleChecksumError as exc:
            bad = exc.index
            if not first <= bad < stop or (bad in want and not skip):
                raise
            if bad in want:
                if exc.key is None:  # (a TFRecord record's: its key from the index)
                    exc.key = entry.keys[bad]
                out[bad] = exc
            todo += [(b, e) for b, e in ((bad + 1, stop), (first, bad)) if b < e]
    return out


class ShardHandles:
    """This process's open shards, at most ``max_open`` kept (least recently used closed first); each
    opened on first use: its table fetched (:meth:`~fastload.train.view.DatasetView.entry`, through the
    shard cache when there is one) and its file opened (from the shard cache when the view has one and the
    shard is remote). Thread safe; a shard is opened once however many threads ask for it at the same time."""

    def __init__(self, view: DatasetView, *, verify: bool, max_open: int, skip_damaged: bool = False) -> None:
        """``view``: the dataset read (its shards' entries and cache:
        :meth:`~fastload.train.view.DatasetView.entry`). ``skip_damaged``: a remote shard the cache
        refuses (its bytes fail their CRC32C) is read uncached, so that only its damaged samples are left
        out (``on_error="skip"``)."""
        self.skip_damaged = skip_damaged
        self.view, self.root = view, view.root
        self.config, self.cache, self.verify = view.s3_config, view.cache(), verify
        self._open: LRU[int, ShardHandle] = LRU(max_items=max_open)
        self._opening: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self.tables_fetched = 0

    def get(self, shard: int) -> ShardHandle:
        """Shard ``shard``'s handle, opened if needed; give it back with :meth:`put`."""
        with self._lock:
            handle = self._open.get(shard)
            if handle is not None:
                handle.users += 1
                return handle
            opening = self._opening.setdefault(shard, threading.Lock())
        with opening:
            with self._lock:
                handle = self._open.get(shard)
                if handle is not None:
                    handle.users += 1
                    return handle
            handle = self._new(shard)
            with self._lock:
                handle.users += 1
                evicted = self._open.put(shard, handle)
                self._opening.pop(shard, None)
                for old in evicted:
                    old.evicted = True
                done = [old for old in evicted if old.users == 0]
        for old in done:
            old.close()
        return handle

    def put(self, handle: ShardHandle) -> None:
        """``handle`` is no longer used by this caller."""
        with self._lock:
            handle.users -= 1
            close = handle.evicted and handle.users == 0
        if close:
            handle.close()

    def drop(self, shard: int, handle: ShardHandle) -> bool:
        """A sample of ``handle`` (a cached copy) did not match the index: drop the copy from the cache and
        the handle from this map so the next :meth:`get` fetches the shard again. False when the handle is
        not a cached copy (the damage is not the cache's)."""
        if not handle.cached or self.cache is None:
            return False
        with self._lock:
            if self._open.get(shard) is handle:
                self._open.pop(shard)
                handle.evicted = True
        self.cache.discard(handle.url, handle.entry)
        return True

    def close(self) -> None:
        with self._lock:
            handles = self._open.clear()
            for h in handles:
                h.evicted = True
            idle = [h for h in handles if h.users == 0]
        for h in idle:
            h.close()

    def _new(self, shard: int) -> ShardHandle:
        entry = self.view.entry(shard)
        with self._lock:
            self.tables_fetched += 1
        if not self.verify and entry.crcs:
            entry = dataclasses.replace(entry, crcs=[])
        url = storage.join(self.root, entry.name)
        remote = storage.is_remote(url)
        try:
            cached = None
            if self.cache is not None and remote and self.cache.cacheable(entry):
                try:
                    cached = self.cache.try_open(url, entry)  # None: the folder cannot hold it
                except VerifyError:  # the remote shard's bytes fail their CRC32C: read it uncached
                    if not (self.skip_damaged and entry.crcs):  # (no per-sample check: wrong bytes unseen)
                        raise
            if cached is not None:
                with cached as f:
                    return ShardHandle(url, entry, fd=os.dup(f.fileno()), cached=True)
            if remote:
                return ShardHandle(
                    url, entry, reader=storage.open_read(url, config=self.config), cached=False
                )
            return ShardHandle(url, entry, fd=os.open(url, os.O_RDONLY), cached=False)
        except FileNotFoundError:  # (NotFoundError and S3's included)
            raise missing_shard(url, entry.name) from None
