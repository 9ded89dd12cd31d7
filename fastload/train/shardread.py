"""Reading samples out of shards: one open shard (local file or S3 object) per :class:`ShardReader`, whose
format (through :mod:`fastload.formats`) makes its bytes into samples: tar runs with one ranged read each,
Parquet rows by row group, TFRecord records; and :class:`ShardReaders`, the readers of a list of tasks."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.core.readplan import ReadTask, runs
from fastload.errors import ConfigError
from fastload.formats.tar.reader import short_read
from fastload.storage import access as storage

if TYPE_CHECKING:
    from fastload.storage.cache import ShardCache

RawSample = dict[str, Any]


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
    ) -> None:
        """``file``: the shard already open (a local file, e.g. from the cache); the reader closes it."""
        self.url = url
        self.entry = entry
        self.name = entry.name
        fmt = formats.for_path(self.name)
        if fmt is None:
            raise ConfigError(
                f"{self.name}: no shard format reads files named so (registered formats: "
                f"{', '.join(formats.names())})"
            )
        self._file: BinaryIO = file if file is not None else storage.open_read(url, config=config)
        self._fd = self._file.fileno() if file is not None or not storage.is_remote(url) else None
        self._seek_lock = threading.Lock()  # for reads that go through the file position
        try:
            self._samples = fmt.samples(entry, read=self._read, file=self._file, fd=self._fd)
        except BaseException:
            self._file.close()
            raise

    def close(self) -> None:
        self._samples.close()
        self._file.close()

    def _read(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset``; safe to call from several threads at once."""
        if self._fd is not None:
            data = os.pread(self._fd, size, offset)
        else:
            fetch_range = getattr(self._file, "fetch_range", None)
            if fetch_range is not None:
                data = fetch_range(offset, offset + size)
            else:
                with self._seek_lock:
                    self._file.seek(offset)
                    data = self._file.read(size)
        if len(data) != size:
            raise short_read(self.name, size, offset)
        return data

    def read_samples(
        self, positions: Sequence[int], columns: Sequence[str] | None = None
    ) -> Iterator[list[RawSample]]:
        """The samples at index ``positions`` of this shard, in that order, as lists (one per run of
        consecutive samples); ``columns`` projects fields where the format can (Parquet)."""
        for first, stop in runs(positions):
            yield list(self.load(range(first, stop), columns)())

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


class ShardReaders:
    """The readers a list of read tasks needs: each shard opened on first use (from the local cache when
    there is one and the shard is remote), shared by the threads reading it, and closed after its last task.
    Use as the ``fetch``/``release`` pair of a :class:`~fastload.train.prefetch.Prefetcher`."""

    def __init__(
        self,
        root: str,
        shards: Sequence[ShardEntry],
        tasks: Sequence[ReadTask],
        *,
        columns: Sequence[str] | None = None,
        config: S3Config | None = None,
        cache: ShardCache | None = None,
        defer: bool = False,
    ) -> None:
        """``defer``: each fetch's result is used at once in the fetching thread (no prefetch), so local
        reads may be done there (see :meth:`ShardReader.load`)."""
        self.root, self.shards, self.columns = root, shards, columns
        self.config, self.cache, self.defer = config, cache, defer
        self._left = Counter(t.shard for t in tasks)
        self._open: dict[int, ShardReader] = {}
        self._opening: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def fetch(self, task: ReadTask, stop: threading.Event | None = None) -> Callable[[], Iterable[RawSample]]:
        """Do the I/O of ``task``; the returned function gives its samples, in its order."""
        return self._reader(task.shard, stop).load(task.positions, self.columns, defer=self.defer)

    def release(self, task: ReadTask) -> None:
        with self._lock:
            self._left[task.shard] -= 1
            reader = self._open.pop(task.shard) if self._left[task.shard] <= 0 else None
        if reader is not None:
            reader.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            readers, self._open = list(self._open.values()), {}
        for reader in readers:
            reader.close()

    def _reader(self, shard: int, stop: threading.Event | None = None) -> ShardReader:
        with self._lock:
            reader = self._open.get(shard)
            if reader is not None:
                return reader
            opening = self._opening.setdefault(shard, threading.Lock())
        with opening:
            with self._lock:
                reader = self._open.get(shard)
            if reader is not None:
                return reader
            entry = self.shards[shard]
            url = storage.join(self.root, entry.name)
            cached = None
            if self.cache is not None and storage.is_remote(url) and self.cache.cacheable(entry):
                cached = self.cache.open(url, entry, stop=stop)
            reader = ShardReader(url, entry, config=self.config, file=cached)
            with self._lock:
                if self._closed:
                    reader.close()
                    raise RuntimeError("shard readers closed")
                self._open[shard] = reader
            return reader
