"""Reading samples out of shards: runs of consecutive samples of a tar shard with one ranged read each
(offsets from the index; the bytes are made into samples by :func:`fastload.formats.tar.reader.read_run`),
Parquet rows by row group and TFRecord records (:mod:`fastload.formats.tfrecord.reader`)."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.core.readplan import ReadTask, runs
from fastload.formats.tar import reader as tar
from fastload.formats.tfrecord.codec import is_tfrecord_name
from fastload.formats.tfrecord.reader import TFRecordSamples
from fastload.storage import access as storage

if TYPE_CHECKING:
    from fastload.storage.cache import ShardCache

RawSample = dict[str, Any]


class ShardReader:
    """Random access to one shard's samples (local file or S3 object); open it, read runs, close it."""

    def __init__(
        self,
        url: str,
        entry: ShardEntry | None,
        *,
        config: S3Config | None = None,
        file: BinaryIO | None = None,
    ) -> None:
        """``file``: the shard already open (a local file, e.g. from the cache); the reader closes it."""
        self.url = url
        self.entry = entry
        self.name = entry.name if entry is not None else url.rsplit("/", 1)[-1]
        self._file: BinaryIO = file if file is not None else storage.open_read(url, config=config)
        self._fd = self._file.fileno() if file is not None or not storage.is_remote(url) else None
        self._seek_lock = threading.Lock()  # for readers that go through the file position (Parquet)
        self._tfrecord: TFRecordSamples | None = None
        if entry is not None and is_tfrecord_name(self.name):
            self._tfrecord = TFRecordSamples(entry, read=self._read, file=self._file)

    def close(self) -> None:
        if self._tfrecord is not None:
            self._tfrecord.close()
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
            raise tar.short_read(self.name, size, offset)
        return data

    def read_samples(
        self, positions: Sequence[int], columns: Sequence[str] | None = None
    ) -> Iterator[list[RawSample]]:
        """The samples at index ``positions`` of this shard, in that order, as lists (one per read).
        Dispatches on the shard's format; ``columns`` projects Parquet fields."""
        if self.name.endswith(".parquet"):
            yield self.read_rows(positions, columns)
            return
        if self._tfrecord is not None:
            yield from self._tfrecord.read_samples(positions)
            return
        for first, stop in runs(positions):
            yield self.read_run(first, stop)

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        """Do the I/O for the samples at ``positions`` now and return a function that makes them into
        samples. For tar shards that second step (parsing, pure Python) is left to the caller's thread, so
        prefetch threads spend their time in I/O that releases the GIL instead of competing for it.
        ``defer``: the caller calls the function at once, in its own thread (no prefetch), so local
        shards with a member layout may do their I/O there too (:func:`~fastload.formats.tar.reader.read_run`
        from the file), and so may plain local TFRecord shards (:meth:`TFRecordSamples.direct_run`)."""
        tfr, fd = self._tfrecord, self._fd
        if defer and tfr is not None and fd is not None and tfr.direct:
            spans = runs(positions)
            return lambda: (s for first, stop in spans for s in tfr.direct_run(fd, first, stop))
        if self.name.endswith(".parquet") or self._tfrecord is not None:
            samples = [s for chunk in self.read_samples(positions, columns) for s in chunk]
            return lambda: samples
        entry = self.entry
        if defer and fd is not None and entry is not None and entry.member_fields:
            spans = runs(positions)
            return lambda: (
                s for first, stop in spans for s in tar.read_run(fd, entry, first, stop, shard=self.name)
            )
        pieces = [
            self._read_piece(a, b) for first, stop in runs(positions) for a, b in self._pieces(first, stop)
        ]
        return lambda: [s for piece in pieces for s in self._parse_piece(*piece)]

    def read_run(self, first: int, stop: int) -> list[RawSample]:
        """Samples ``first..stop-1`` of a tar shard, read and parsed now."""
        return [s for a, b in self._pieces(first, stop) for s in self._parse_piece(*self._read_piece(a, b))]

    def _pieces(self, first: int, stop: int) -> list[tuple[int, int]]:
        """Samples ``first..stop-1`` as reads: one from S3; from a local file, whole samples of at most
        ``LOCAL_READ_BYTES`` each (:func:`~fastload.formats.tar.reader.pieces`)."""
        entry = self.entry
        assert entry is not None and entry.offsets
        return [(first, stop)] if self._fd is None else tar.pieces(entry, first, stop)

    def _read_piece(self, first: int, stop: int) -> tuple[int, int, int, bytes]:
        assert self.entry is not None and self.entry.offsets
        offset, size = tar.span(self.entry, first, stop)
        return first, stop, offset, self._read(offset, size)

    def _parse_piece(self, first: int, stop: int, offset: int, data: bytes) -> Iterable[RawSample]:
        assert self.entry is not None
        return tar.read_run(data, self.entry, first, stop, shard=self.name)

    def read_rows(self, positions: Sequence[int], columns: Sequence[str] | None) -> list[RawSample]:
        """Rows of a Parquet shard (whole row groups are read, then the wanted rows picked)."""
        with self._seek_lock:
            return self._read_rows(positions, columns)

    def _read_rows(self, positions: Sequence[int], columns: Sequence[str] | None) -> list[RawSample]:
        import pyarrow.parquet as pq

        entry = self.entry
        assert entry is not None
        self._file.seek(0)
        parquet = pq.ParquetFile(self._file)
        starts = [0]
        for rg in entry.row_groups:
            starts.append(starts[-1] + rg[2])
        wanted_set = set(positions)
        wanted = sorted(wanted_set)
        cols = None if columns is None else ["__key__", *[c for c in columns if c != "__key__"]]
        rows: dict[int, RawSample] = {}
        g = 0
        for p in wanted:
            while starts[g + 1] <= p:
                g += 1
            if p in rows:
                continue
            table = parquet.read_row_group(g, columns=cols).to_pydict()
            names = list(table)
            for r in range(len(table["__key__"])):
                pos = starts[g] + r
                if pos in wanted_set:
                    sample: RawSample = {n: table[n][r] for n in names if table[n][r] is not None}
                    sample["__index__"] = pos
                    rows[pos] = sample
        return [rows[p] for p in positions]


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
