"""One open shard (local file, S3 object, or its bytes in memory) and its ranged reads: :class:`ShardReader`
hands its format (through :mod:`fastload.formats`) a thread-safe ``read(offset, size)``
(:class:`ShardRead`; with ``many(ranges)`` on a pool for a remote shard) and reads runs of samples."""

from __future__ import annotations

import functools
import io
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from fastload import formats
from fastload.config import S3Config
from fastload.core.filters import Filter
from fastload.core.index import ShardEntry
from fastload.core.readplan import runs
from fastload.errors import ConfigError
from fastload.formats.shard import short_read
from fastload.storage import access as storage
from fastload.storage.tables import missing_shard

RawSample = dict[str, Any]


def _read_range(
    file: BinaryIO, fd: int | None, lock: threading.Lock, name: str, offset: int, size: int
) -> bytes:
    """Exactly ``size`` bytes of the shard ``file`` at ``offset``; safe to call from several threads at once
    (``lock`` guards reads that go through the file position)."""
    if fd is not None:
        data = os.pread(fd, size, offset)
    else:
        fetch_range = getattr(file, "fetch_range", None)
        if fetch_range is not None:
            data = fetch_range(offset, offset + size)
        else:
            with lock:
                file.seek(offset)
                data = file.read(size)
    if len(data) != size:
        raise short_read(name, size, offset)
    return data


class ShardRead:
    """A shard's ``read(offset, size)`` (:func:`_read_range`) and, for a remote shard given a pool,
    ``many(ranges)``: several ranges fetched at once on that pool (each a round trip: one pool for a pass
    over the shards, not threads started per read). ``data``: the whole shard, in memory, its bytes checked
    against the index's CRC32C by the caller (a format may read it directly and skip checks of its own)."""

    def __init__(
        self,
        file: BinaryIO,
        fd: int | None,
        name: str,
        pool: ThreadPoolExecutor | None,
        data: bytes | None = None,
    ) -> None:
        self._args = (file, fd, threading.Lock(), name)
        self.data = data
        if data is not None:  # in memory: nothing to wait for
            self.many = functools.partial(_read_each, self)
        elif pool is not None and fd is None:
            self.many = functools.partial(_read_many, pool, self)

    def __call__(self, offset: int, size: int) -> bytes:
        return _read_range(*self._args, offset, size)


def _read_each(read: ShardRead, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    return [read(start, end - start) for start, end in ranges]


def _read_many(pool: ThreadPoolExecutor, read: ShardRead, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    futures = [pool.submit(read, start, end - start) for start, end in ranges]
    try:
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()


class ShardReader:
    """Random access to one shard's samples (local file or S3 object); open it, read runs, close it. The
    shard's format (:func:`fastload.formats.for_path`, once per shard) turns bytes into samples
    (:meth:`~fastload.formats.ShardFormat.samples`); this class owns the file and its ranged reads."""

    def __init__(
        self,
        url: str,
        entry: ShardEntry,
        *,
        config: S3Config | None = None,
        file: BinaryIO | None = None,
        pool: ThreadPoolExecutor | None = None,
        data: bytes | None = None,
    ) -> None:
        """``file``: the shard already open (a local file, e.g. from the cache); the reader closes it.
        ``pool``: where a remote shard's several ranges of one read are fetched at once (:class:`ShardRead`;
        the caller owns it). ``data``: the whole shard's bytes, fetched and checked against the entry's size
        and CRC32C already (read from memory)."""
        self.url = url
        self.entry = entry
        self.name = entry.name
        self.cached = False  # reads a copy from the shard cache (set by ShardReaders)
        fmt = formats.for_path(self.name)
        if fmt is None:
            raise ConfigError(
                f"{self.name}: no shard format reads files named so (registered formats: "
                f"{', '.join(formats.names())})"
            )
        try:
            self._file: BinaryIO = (
                io.BytesIO(data)
                if data is not None
                else file
                if file is not None
                else storage.open_read(url, config=config)
            )
        except FileNotFoundError:  # (NotFoundError and S3's included)
            raise missing_shard(url, self.name) from None
        local = file is not None or not storage.is_remote(url)
        self._fd = self._file.fileno() if local and data is None else None
        # (a function of the file, not of this reader: no reference cycle keeps a closed shard's table)
        read = ShardRead(self._file, self._fd, self.name, pool, data)
        try:
            self._samples = fmt.samples(entry, read=read, file=self._file, fd=self._fd)
        except BaseException:
            self._file.close()
            raise

    def close(self) -> None:
        self._samples.close()
        self._file.close()

    def read_samples(
        self, positions: Sequence[int], columns: Sequence[str] | None = None
    ) -> Iterator[list[RawSample]]:
        """The samples at index ``positions`` of this shard, in that order, as lists (one per run of
        consecutive samples); ``columns`` projects fields where the format can (Parquet)."""
        for first, stop in runs(positions):
            yield list(self.load(range(first, stop), columns)())

    def select(self, flt: Filter, partition: Mapping[str, Any]) -> tuple[list[tuple[int, int]], int]:
        """``(runs of the rows filter flt keeps, bytes fetched to decide)``, for formats that select rows
        (Parquet: ``ParquetSamples.select``); ``partition``: the shard's typed partition values."""
        select = getattr(self._samples, "select", None)
        if select is None:
            raise ConfigError(f"{self.name}: its format cannot filter rows; filter on partition columns")
        return select(flt, partition)  # type: ignore[no-any-return]

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        """Do the I/O for the samples at ``positions`` now and return a function that makes them into
        samples (:meth:`fastload.formats.SampleSource.load`). For tar shards that second step (parsing,
        pure Python) is left to the caller's thread, so prefetch threads spend their time in I/O that
        releases the GIL instead of competing for it. ``defer``: the caller calls the function at once, in
        its own thread (no prefetch), so local shards with a member layout may do their I/O there too, and
        so may plain local TFRecord shards."""
        return self._samples.load(positions, columns, defer=defer)
