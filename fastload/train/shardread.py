"""Reading samples out of shards: :class:`ShardReaders`, the readers of a list of tasks (one
:class:`~fastload.train.shardreader.ShardReader` per open shard, whose format makes its bytes into samples:
tar runs with one ranged read each, Parquet rows by row group, TFRecord records): tables fetched when a
shard is reached (or ahead), shards opened on first use, whole shards read in one request where their format
allows it, and each dropped when its last reference is consumed."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from typing import TYPE_CHECKING

import crc32c

from fastload import formats
from fastload.core.index import ShardEntry
from fastload.core.readplan import ReadTask, iter_reads
from fastload.errors import SampleChecksumError, VerifyError
from fastload.gcpause import gc_paused
from fastload.storage import access as storage
from fastload.storage.tables import missing_shard
from fastload.train.damaged import raising, read_past_damage
from fastload.train.shardreader import RawSample, ShardReader

__all__ = ["RANGE_THREADS", "TABLES_AHEAD", "RawSample", "ShardReader", "ShardReaders"]

TABLES_AHEAD = 4  # sample tables of the shards of the next runs fetched at once, while a run is read
RANGE_THREADS = 16  # the ranges of reads of remote shards (Parquet column chunks) in flight at once

if TYPE_CHECKING:
    from fastload.config import S3Config
    from fastload.train.view import DatasetView


class ShardReaders:
    """The readers of one pass over a list of sample references: each shard's full entry (a v2 sample table
    fetched when the planner reaches the shard, :meth:`entry`; optionally the next one fetched ahead,
    :meth:`ahead`), each shard opened on first use (from the local cache when there is one and the shard is
    remote), shared by the threads reading it; both dropped after the shard's last reference is consumed,
    so a process holds the tables of the shards in flight only. Use :meth:`tasks` and the
    ``fetch``/``release`` pair with a :class:`~fastload.train.prefetch.Prefetcher`.

    A sample that fails its CRC32C in a shard read from the cache has the cached copy dropped and the shard
    fetched again, once per shard (the cache heals); a second failure raises, or with ``skip_damaged`` the
    sample's :class:`~fastload.errors.SampleChecksumError` takes its place in the task's samples and the
    rest of the task is read on (:func:`~fastload.train.damaged.read_past_damage`)."""

    def __init__(
        self,
        view: DatasetView,
        refs: Sequence[tuple[int, int]],
        *,
        columns: Sequence[str] | None = None,
        defer: bool = False,
        verify: bool = True,
        skip_damaged: bool = False,
        parts: Callable[[], int] | None = None,
    ) -> None:
        """``view``: the dataset read (its shards' entries, cache, and sample tables kept between passes:
        :meth:`~fastload.train.view.DatasetView.entry`, so a table kept there is not fetched again).
        ``defer``: each fetch's result is used at once in the fetching thread (no prefetch), so local
        reads may be done there (see :meth:`ShardReader.load`). ``verify``: check each sample's CRC32C
        where the index has them (tar, index v2). ``skip_damaged``: a sample that fails its CRC32C is given
        as its error, not raised. ``parts``: the ranged GETs one read task wants at once now (a tuned
        loader's task size in parts): a remote shard opened then reads with at least that many."""
        self.skip_damaged = skip_damaged
        self.view, self.root, self.shards, self.columns = view, view.root, view.shards(), columns
        self.shard_format = shard_format = view.shard_format
        self.config, self.cache, self.defer, self.verify = view.s3_config, view.cache(), defer, verify
        self._parts = parts
        self._left = Counter(map(itemgetter(0), refs))  # references not yet consumed, per shard
        self._entries: dict[int, ShardEntry] = {}  # full entries of the shards in flight
        self._ahead: dict[int, Future[ShardEntry]] = {}
        self._tables: ThreadPoolExecutor | None = None
        self._ranges: ThreadPoolExecutor | None = None  # remote shards' ranges of one read, fetched at once
        self._open: dict[int, ShardReader] = {}
        self._retired: dict[int, list[ShardReader]] = {}  # replaced after a heal, closed with the shard
        self._healed: set[int] = set()
        self._opening: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.tables_completed = 0  # full entries made for this pass (fetched, or kept by the view)
        # its shards' reads take any positions (Parquet): those that fit in a task are planned table-less
        fmt = formats.by_name(shard_format)
        self._any_positions = fmt.any_positions
        # a detached entry completed from its shard's whole bytes (Parquet): a whole-shard read needs no table
        self._whole_entry: Callable[[ShardEntry, bytes], ShardEntry | None] | None
        self._whole_entry = fmt.whole_entry if self._any_positions else None

    def tasks(
        self,
        refs: Sequence[tuple[int, int]],
        *,
        max_task_bytes: int | Callable[[], int],
        ahead: bool = False,
        hold_bytes: int = 0,
    ) -> Iterator[ReadTask]:
        """The read tasks of ``refs`` (:func:`~fastload.core.readplan.iter_reads`), each shard's planned
        when reached, after its table is fetched; ``ahead``: the tables of the next ``TABLES_AHEAD`` shards
        fetched meanwhile, at once (a remote table is a round trip: one at a time, a projected or filtered
        read that takes little of each shard waited for them one after another). ``hold_bytes``: for a
        format read by row groups, references that come back to a row group (a sample shuffle) are read
        with it, up to that many bytes ahead of their turn (``ReadTask.serves``; see
        :class:`~fastload.core.readplan.GroupReads`).
        (The cyclic collector is paused while a task is planned: tables and plans are many small acyclic
        objects, see :mod:`fastload.gcpause`.)"""
        planned = iter_reads(
            refs,
            self.entry,
            max_task_bytes=max_task_bytes,
            ahead=self.ahead if ahead else None,
            depth=TABLES_AHEAD,
            whole=self._whole if self._any_positions else None,
            hold_bytes=hold_bytes if self._any_positions else 0,
        )
        while True:
            with gc_paused():
                task = next(planned, None)
            if task is None:
                return
            yield task

    def _whole(self, shard: int) -> int | None:
        """A shard's size when its table is yet to be fetched (so its reader, not the planner, fetches it)."""
        entry = self.shards[shard]
        return entry.bytes if entry.detached else None

    def entry(self, shard: int) -> ShardEntry:
        """Shard ``shard``'s full entry (its sample table fetched once while the shard is in flight; a
        fetch ahead that has not started yet is done in this thread instead of waited for)."""
        with self._lock:
            full = self._entries.get(shard)
            pending = self._ahead.pop(shard, None)
        if full is not None:
            return full
        if pending is not None and pending.cancel():
            pending = None
        full = pending.result() if pending is not None else self._full_entry(shard)
        with self._lock:
            if self._left[shard] > 0:
                full = self._entries.setdefault(shard, full)
        return full

    def ahead(self, shard: int) -> None:
        """Start fetching shard ``shard``'s table in the background (if it has one to fetch)."""
        with self._lock:
            if self._closed or shard in self._entries or shard in self._ahead:
                return
            if not self.shards[shard].detached:
                return
            if self._tables is None:
                self._tables = ThreadPoolExecutor(
                    max_workers=TABLES_AHEAD, thread_name_prefix="fastload-tables"
                )
            self._ahead[shard] = self._tables.submit(self._full_entry, shard)

    def _full_entry(self, shard: int) -> ShardEntry:
        entry = self.shards[shard]
        if entry.detached:
            entry = self.view.entry(shard)
            with self._lock:
                self.tables_completed += 1
        if not self.verify and entry.crcs:
            entry = dataclasses.replace(entry, crcs=[])
        return entry

    def fetch(
        self, task: ReadTask, stop: threading.Event | None = None
    ) -> Callable[[], Iterable[RawSample | SampleChecksumError]]:
        """Do the I/O of ``task``; the returned function gives its samples, in its order (with
        ``skip_damaged``, a sample that fails its CRC32C as its :class:`SampleChecksumError`)."""
        if not self.skip_damaged:
            return self._fetch(task, stop)
        try:
            parse = self._fetch(task, stop)
        except SampleChecksumError as exc:
            parse = functools.partial(raising, exc)
        return lambda: read_past_damage(
            task.positions,
            parse,
            lambda positions: self._reader(task.shard, stop)[0].load(positions, self.columns, defer=True)(),
            lambda index: self.entry(task.shard).keys[index],
        )

    def _fetch(
        self, task: ReadTask, stop: threading.Event | None = None
    ) -> Callable[[], Iterable[RawSample]]:
        if self._reads_whole(task):
            self._open_whole(task.shard)
        reader, cached = self._reader(task.shard, stop)
        try:
            parse = reader.load(task.positions, self.columns, defer=self.defer)
        except VerifyError:
            if not cached or not self._heal(task.shard, reader):
                raise
            return self._fetch(task, stop)
        if not cached:
            return parse
        return lambda: self._healing(task, reader, parse, stop)

    def _reads_whole(self, task: ReadTask) -> bool:
        """Whether ``task`` reads every row, every column, of a remote shard whose table is not fetched (a
        shard planned whole, see :meth:`tasks`, not cached locally): then the shard is fetched in one GET
        and its format completes its entry from its bytes (:meth:`_open_whole`), no table fetched. Only with
        the file's CRC32C in the manifest: that check stands in for the pages' own."""
        entry = self.shards[task.shard]
        if self._whole_entry is None or self.columns is not None or not entry.detached or not entry.checksum:
            return False
        if len(task.positions) < entry.samples or not storage.is_remote(self.root):
            return False
        if self.cache is not None and self.cache.cacheable(entry):
            return False
        return len(set(task.positions)) == entry.samples

    def _open_whole(self, shard: int) -> None:
        """Open ``shard`` from its whole bytes, fetched now and checked against the manifest (size and
        CRC32C of the file), its entry completed by its format (else from its table, as usual)."""
        assert self._whole_entry is not None
        with self._lock:
            if shard in self._open:
                return
            opening = self._opening.setdefault(shard, threading.Lock())
        with opening:
            with self._lock:
                if shard in self._open:
                    return
            entry = self.shards[shard]
            url = storage.join(self.root, entry.name)
            try:
                data = storage.read_bytes(url, config=self.config)
            except FileNotFoundError:  # (NotFoundError and S3's included)
                raise missing_shard(url, entry.name) from None
            crc = f"{crc32c.crc32c(data):08x}"
            if len(data) != entry.bytes or crc != entry.checksum:
                raise VerifyError(
                    f"{url}: {len(data)} bytes with CRC32C {crc}, index.json says {entry.bytes} bytes with "
                    f"{entry.checksum}: the shard changed or was damaged since it was packed; run "
                    "`fastload verify` and re-pack or restore it",
                    shard=entry.name,
                )
            full = self._whole_entry(entry, data) or self.entry(shard)
            reader = ShardReader(url, full, config=self._reader_config(), data=data)
            with self._lock:
                if self._closed:
                    reader.close()
                    raise RuntimeError("shard readers closed")
                self._open[shard] = reader
                if self._left[shard] > 0:
                    self._entries.setdefault(shard, full)

    def _healing(
        self,
        task: ReadTask,
        reader: ShardReader,
        parse: Callable[[], Iterable[RawSample]],
        stop: threading.Event | None,
    ) -> Iterator[RawSample]:
        """The samples of ``parse()`` (a task of a shard read from the cache); on a sample that does not
        match the index, the rest of the task read again from a fresh copy (once per shard)."""
        done = 0
        try:
            for sample in parse():
                yield sample
                done += 1
        except VerifyError:
            if not self._heal(task.shard, reader):
                raise
            again, _ = self._reader(task.shard, stop)
            yield from again.load(task.positions[done:], self.columns, defer=True)()

    def _heal(self, shard: int, reader: ShardReader) -> bool:
        """Whether to read again after ``reader`` (a cached copy of shard ``shard``) gave a sample that
        does not match the index: its copy dropped from the cache so that the next open fetches the shard
        again, once per shard (or done already by another thread); False when that copy was the fresh
        one (the damage is not the cache's)."""
        with self._lock:
            if self._closed or self.cache is None:
                return False
            if shard in self._healed:
                return reader not in self._open.values()  # an older copy: read the fresh one
            self._healed.add(shard)
            if self._open.get(shard) is reader:
                del self._open[shard]
                self._retired.setdefault(shard, []).append(reader)
            entry = self._entries.get(shard, self.shards[shard])
        self.cache.discard(reader.url, entry)
        return True

    def release(self, task: ReadTask) -> None:
        with self._lock:
            self._left[task.shard] -= len(task.positions)
            done = self._left[task.shard] <= 0
            reader = self._open.pop(task.shard, None) if done else None
            retired = self._retired.pop(task.shard, []) if done else []
            if done:
                self._entries.pop(task.shard, None)
                self._opening.pop(task.shard, None)
        for r in [*retired, *([reader] if reader is not None else [])]:
            r.close()

    def _reader_config(self) -> S3Config | None:
        """The S3 settings of a shard opened now: the view's, its parts at once raised to what a tuned
        read task wants (else a task of several parts fetches them one by one)."""
        config, parts = self.config, self._parts
        if config is None or parts is None or (want := parts()) <= config.max_concurrency:
            return config
        return dataclasses.replace(config, max_concurrency=want)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            readers, self._open = list(self._open.values()), {}
            readers += [r for rs in self._retired.values() for r in rs]
            self._retired, self._entries = {}, {}
            pending, self._ahead = list(self._ahead.values()), {}
            pools = [p for p in (self._tables, self._ranges) if p is not None]
            self._tables = self._ranges = None
        for future in pending:
            future.cancel()
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        for reader in readers:
            reader.close()

    def _range_pool(self) -> ThreadPoolExecutor | None:
        with self._lock:
            if self._ranges is None and not self._closed:
                self._ranges = ThreadPoolExecutor(
                    max_workers=RANGE_THREADS, thread_name_prefix="fastload-ranges"
                )
            return self._ranges

    def _reader(self, shard: int, stop: threading.Event | None = None) -> tuple[ShardReader, bool]:
        """The open reader of ``shard`` and whether it reads a cached copy."""
        with self._lock:
            reader = self._open.get(shard)
            if reader is not None:
                return reader, reader.cached
            opening = self._opening.setdefault(shard, threading.Lock())
        with opening:
            with self._lock:
                reader = self._open.get(shard)
            if reader is not None:
                return reader, reader.cached
            entry = self.entry(shard)
            url = storage.join(self.root, entry.name)
            cached = None
            if self.cache is not None and storage.is_remote(url) and self.cache.cacheable(entry):
                try:
                    cached = self.cache.try_open(url, entry, stop=stop)  # None: the folder cannot hold it
                except VerifyError:  # the remote shard's bytes fail their CRC32C: the cache refuses it
                    if not (self.skip_damaged and entry.crcs):  # (no per-sample check: wrong bytes unseen)
                        raise
                    # read it uncached instead: each sample is checked, the damaged ones left out
                    cached = None
            pool = self._range_pool() if cached is None and storage.is_remote(url) else None
            reader = ShardReader(url, entry, config=self._reader_config(), file=cached, pool=pool)
            reader.cached = cached is not None
            with self._lock:
                if self._closed:
                    reader.close()
                    raise RuntimeError("shard readers closed")
                self._open[shard] = reader
            return reader, reader.cached
