"""``fastload.MapDataset``: a packed dataset as a map-style torch dataset: ``len(ds)``, ``ds[i]`` for a
global sample number (shards in manifest order), slices and lists of numbers, and ``__getitems__``, which
``torch.utils.data.DataLoader`` calls with each batch's indices, so any ``Sampler`` works
(``RandomSampler`` through ``shuffle=True``, ``WeightedRandomSampler``, ``DistributedSampler``).

One sample is one ranged read of its bytes through its shard's sample table (fetched on first use, kept in
a bounded LRU with the shard's open file: :mod:`.mapshards`); a batch's samples are grouped by shard, the
neighbours within a shard read together (:func:`fastload.core.randomaccess.spans`), different shards at the
same time on a small thread pool. Parquet is read a row group at a time (the smallest unit pyarrow decodes
with its page checksums), and the last row groups decoded are kept (bounded in bytes) for the neighbours.
Everything per process is rebuilt in a DataLoader worker (fork or spawn); the pickled dataset is the
manifest and the options only (with ``filters=``, also the filtered view: each shard's kept rows, and the
sample tables fetched to decide them, which are read with and not fetched again).

``filters=`` (and a partition folder as the source) keep the rows iteration keeps
(:mod:`.filtering`, decided when the dataset is made): ``len`` counts them and ``ds[i]`` is the ``i``-th
of them, shard after shard in manifest order, rows in shard order.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch.utils.data

from fastload.config import S3Config
from fastload.core.lru import LRU
from fastload.core.randomaccess import group_starts, locate, resolve, sample_starts
from fastload.errors import ConfigError, SampleChecksumError, VerifyError
from fastload.train.mapshards import RawSample, ShardHandle, ShardHandles, read_spans
from fastload.train.options import CacheConfig, DecodeConfig
from fastload.train.position import SkippedSample, warn_damaged
from fastload.train.reading import SKIPPED, damaged, finish
from fastload.train.telemetry import SharedCounters, Tally, TelemetryMethods, clock_ns
from fastload.train.view import DatasetView, open_dataset

DEFAULT_GAP_BYTES = 256 << 10
NAMED = 10_000  # samples skipped named in skipped_samples, at most (the rest counted)


class _Process:
    """What one process holds: open shards, decoded row groups, the thread pool for batches."""

    def __init__(self, handles: ShardHandles, row_group_bytes: int, threads: int) -> None:
        self.pid = os.getpid()
        self.handles = handles
        self.groups: LRU[tuple[int, int], list[RawSample]] = LRU(max_weight=row_group_bytes)
        self.lock = threading.Lock()
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def pool(self) -> ThreadPoolExecutor:
        with self.lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fastload-map")
            return self._pool

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self.handles.close()
        with self.lock:
            self.groups.clear()


class MapDataset(TelemetryMethods, torch.utils.data.Dataset[Any]):
    """Random access to the samples of a packed dataset (a folder or ``s3://`` prefix with ``index.json``;
    tar or TFRecord shards without one), numbered ``0 .. len - 1`` shard after shard in manifest order.
    ``ds[i]`` is the dict iteration gives (``__key__``, ``__shard__``, ``__index__``, fields), decoded and
    mapped the same way.

    ``filters``: only the rows that match, as :class:`~fastload.ShardDataset` keeps them (pyarrow's
    convention, ``docs/parquet.md``), numbered ``0 .. len - 1`` in the same order; a partition folder
    (``.../split=train``) as the source is such a filter.

    Decoding as :class:`~fastload.ShardDataset`: ``decode``, ``images``, ``allow_pickle``, ``map``,
    ``columns`` (Parquet), ``on_error`` (``"skip"``: a sample that fails to decode or map, or whose bytes
    fail their CRC32C, is left out of a batch, counted in :attr:`skipped` each time and named in
    :attr:`skipped_samples` once, the first ``NAMED`` (10,000; more counted in ``skipped_unnamed``);
    ``ds[i]`` alone raises, having nothing to return), ``verify_samples`` (each
    tar sample's CRC32C checked; a mismatch raises ``SampleChecksumError`` naming shard, key and offset),
    ``partition_columns`` (each shard's hive partition values added to its samples, typed as filters
    compare them).
    ``key_column``: for Parquet files without an index, the column that names samples (as
    :class:`~fastload.ShardDataset`).
    Remote shards: ``cache_dir`` (whole shards and tables kept on disk, ``cache_limit_bytes``,
    ``cache_verify``), ``s3_config``. Bounds, per process: ``max_open_shards`` shards with their tables
    and open files; ``row_group_cache_bytes`` of Parquet row groups (by stored size; the last one is always
    kept); ``threads`` reads of different shards at once in a batch; ``max_gap_bytes``: samples of a batch
    in one shard whose byte ranges are at most this far apart are read with one ranged read.
    ``version``: read the dataset as it was at that version (an appended dataset's first shards); None: the
    newest when opened.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: bool = True,
        images: bool = True,
        allow_pickle: bool = False,
        map: Callable[[dict[str, Any]], Any] | None = None,
        columns: Sequence[str] | None = None,
        filters: Any = None,
        on_error: str = "raise",
        verify_samples: bool = True,
        partition_columns: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        cache_verify: bool = True,
        s3_config: S3Config | None = None,
        key_column: str | None = None,
        threads: int = 8,
        max_open_shards: int = 64,
        row_group_cache_bytes: int = 64 << 20,
        max_gap_bytes: int = DEFAULT_GAP_BYTES,
        version: int | None = None,
    ) -> None:
        for name, value, least in (("threads", threads, 1), ("max_open_shards", max_open_shards, 1)):
            if value < least:
                raise ConfigError(f"{name}={value} must be >= {least}")
        if row_group_cache_bytes < 0 or max_gap_bytes < 0:
            raise ConfigError(f"{row_group_cache_bytes=} and {max_gap_bytes=} must be >= 0")
        self.decoding = DecodeConfig(
            decode=decode,
            images=images,
            allow_pickle=allow_pickle,
            map=map,
            columns=columns,
            on_error=on_error,
            verify_samples=verify_samples,
            partition_columns=partition_columns,
        )
        self.threads, self.max_open_shards = threads, max_open_shards
        self.row_group_cache_bytes, self.max_gap_bytes = row_group_cache_bytes, max_gap_bytes
        self.view: DatasetView = open_dataset(
            source,
            s3_config=s3_config,
            key_column=key_column,
            filters=filters,
            columns=columns,
            partition_columns=partition_columns,
            version=version,
            # (no table memo: the open shards' LRU keeps their tables)
            caching=CacheConfig(
                path=cache_dir, limit_bytes=cache_limit_bytes, verify=cache_verify, tables_bytes=0
            ),
        )
        self.starts = sample_starts(self.view.counts)
        self._telemetry = SharedCounters()  # per-stage counters, summed over workers (report())
        self.skipped = 0  # samples left out with on_error="skip", by this process (each time)
        self.skipped_samples: list[SkippedSample] = []  # ... their names, each sample once, up to NAMED
        self.skipped_unnamed = 0  # samples past NAMED: counted, not named
        self._named: set[tuple[str, str]] = set()  # (shard, key) of those named
        self._shards: set[str] = set()  # shards with a sample skipped (each warned about once)
        self._proc: _Process | None = None
        self._proc_lock: tuple[int, threading.Lock] | None = None

    # the dataset opened (fastload.train.view), by the names it always had here
    root = property(lambda self: self.view.root)
    index = property(lambda self: self.view.index)
    s3_config = property(lambda self: self.view.s3_config)
    caching = property(lambda self: self.view.caching)
    filters = property(lambda self: self.view.filters, doc="the rows kept (with a partition folder's)")
    filtered = property(lambda self: self.view.filtered)
    partitions = property(lambda self: self.view.partitions)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __repr__(self) -> str:
        return f"MapDataset({self.root!r}, {len(self.index.shards)} shards, {len(self)} samples)"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_proc"] = None  # files, threads and caches stay in their process
        state["_proc_lock"] = None
        return state

    def locate(self, index: int) -> tuple[str, int]:
        """``(shard name, position in the shard)`` of sample ``index``."""
        shards, positions = self._locate(resolve([index], len(self)))
        return self.index.shards[int(shards[0])].name, int(positions[0])

    def _locate(
        self, indices: np.ndarray[Any, np.dtype[np.int64]]
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]]:
        """``(shard, row of the shard)`` of each of ``indices`` (numbers among the kept rows)."""
        shards, positions = locate(self.starts, indices)
        if self.filtered is not None:
            positions = self.filtered.rows(shards, positions)
        return shards, positions

    def __getitem__(self, index: int | slice | Sequence[int]) -> Any:
        """Sample ``index`` (negative counts from the end); a list of samples for a slice or a list of
        numbers (read as :meth:`__getitems__` reads a batch)."""
        if isinstance(index, slice):
            return self.__getitems__(list(range(*index.indices(len(self)))))
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            out = self._read(resolve([int(index)], len(self)), single=True)
            return out[0]
        if isinstance(index, (np.ndarray, torch.Tensor)) and index.ndim == 0:
            return self[int(index)]
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor)):
            return self.__getitems__(index)
        raise TypeError(
            f"MapDataset indices are integers, slices or lists of integers, not {type(index).__name__}"
        )

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples ``indices``, in that order (what ``DataLoader`` calls with a batch's indices): one
        ranged read per span of neighbouring samples of a shard, different shards' reads at once. With
        ``on_error="skip"`` a sample that fails to decode or map, or is damaged, is left out (the list is
        shorter)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        return self._read(resolve(indices, len(self)), single=False)

    def close(self) -> None:
        """Close this process's open shards and threads (they are opened again when needed)."""
        with self._guard():
            proc, self._proc = self._proc, None
        if proc is not None and proc.pid == os.getpid():
            proc.close()

    def __enter__(self) -> MapDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ------------------------------------------------------------------------------------------

    def _guard(self) -> threading.Lock:
        """This process's lock over ``_proc`` (a forked child never inherits one a parent thread held)."""
        held = self._proc_lock
        if held is None or held[0] != os.getpid():
            held = self._proc_lock = (os.getpid(), threading.Lock())
        return held[1]

    def _local(self) -> _Process:
        """This process's state, built in a new process (a forked worker drops its parent's)."""
        proc = self._proc
        if proc is not None and proc.pid == os.getpid():
            return proc
        with self._guard():
            proc = self._proc
            if proc is None or proc.pid != os.getpid():
                handles = ShardHandles(
                    self.view,
                    verify=self.decoding.verify_samples,
                    max_open=self.max_open_shards,
                    skip_damaged=self.decoding.on_error == "skip",
                )
                proc = self._proc = _Process(handles, self.row_group_cache_bytes, self.threads)
        return proc

    def _read(self, indices: np.ndarray[Any, np.dtype[np.int64]], *, single: bool) -> list[Any]:
        proc = self._local()
        shards, positions = self._locate(indices)
        wanted: dict[int, list[int]] = {}
        for s, p in zip(shards.tolist(), positions.tolist(), strict=True):
            wanted.setdefault(s, []).append(p)
        jobs = [(s, sorted(set(ps))) for s, ps in wanted.items()]
        if not jobs:
            return []
        on = self._telemetry.on
        started = clock_ns() if on else 0
        if len(jobs) == 1:
            found = [self._shard_samples(proc, *jobs[0])]
        else:
            found = list(proc.pool().map(lambda job: self._shard_samples(proc, *job), jobs))
        fetched = clock_ns() if on else 0
        times: list[int] | None = [0, 0, 0] if on else None
        by_ref = {(s, p): raw for (s, _), raws in zip(jobs, found, strict=True) for p, raw in raws.items()}
        out: list[Any] = []
        noted: list[SkippedSample] = []
        seen: set[tuple[int, int]] = set()
        name_of = self.index.shards
        for s, p in zip(shards.tolist(), positions.tolist(), strict=True):
            raw = by_ref[(s, p)]
            if isinstance(raw, SampleChecksumError):  # on_error="skip": a damaged sample
                if single:  # nothing to return: the error itself
                    raise raw
                self._skip(proc, damaged(raw))
                continue
            if (s, p) in seen:  # the same sample twice: its own dict each time
                raw = dict(raw)
            seen.add((s, p))
            raw["__shard__"] = name_of[s].name
            if self.partitions is not None:
                raw.update(self.partitions[s])
            sample = raw if self.decoding.plain else finish(raw, self.decoding, noted.append, times)
            if sample is SKIPPED:
                if single:  # nothing to return: the error itself
                    finish(raw, dataclasses.replace(self.decoding, on_error="raise"))
                self._skip(proc, noted.pop())
                continue
            out.append(sample)
        if times is not None:  # random reads: fetch and parse together, items: samples
            tally = Tally(self._telemetry, s3=torch.utils.data.get_worker_info() is not None)
            tally.stage("fetch", fetched - started, len(indices))
            if times[0]:
                tally.stage("decode", times[0], len(out))
            if times[1]:
                tally.stage("map", times[1], len(out))
            tally.count("samples", len(out))
            tally.flush()
        return out

    def _skip(self, proc: _Process, record: SkippedSample) -> None:
        """Count and name a sample left out with ``on_error="skip"`` (a damaged one warned, once per
        shard)."""
        with proc.lock:
            self.skipped += 1
            name = (record.shard, record.key)
            if name in self._named:
                return
            first = record.offset is not None and record.shard not in self._shards
            self._shards.add(record.shard)
            if len(self._named) < NAMED:
                self._named.add(name)
                self.skipped_samples.append(record)
            else:
                self.skipped_unnamed += 1
        if first:
            warn_damaged(record, "(left out of their batches); MapDataset.skipped_samples")

    def _shard_samples(
        self, proc: _Process, shard: int, positions: list[int]
    ) -> Mapping[int, RawSample | SampleChecksumError]:
        """``position -> raw sample`` for ``positions`` (ascending) of ``shard``; a cached copy that fails
        its check is dropped and the shard read again, once. With ``on_error="skip"``, a sample whose bytes
        fail their CRC32C (in the fresh copy) maps to its error (:func:`read_spans`)."""
        for attempt in (0, 1):
            handle = proc.handles.get(shard)
            try:
                if handle.entry.row_groups:
                    return self._rows(proc, shard, handle, positions)
                return read_spans(handle, positions, self.decoding.columns, self.max_gap_bytes, skip=False)
            except VerifyError as exc:
                if not attempt and proc.handles.drop(shard, handle):
                    continue
                if isinstance(exc, SampleChecksumError) and self.decoding.on_error == "skip":
                    return read_spans(handle, positions, self.decoding.columns, self.max_gap_bytes, skip=True)
                raise
            finally:
                proc.handles.put(handle)
        raise AssertionError("unreachable")

    def _rows(
        self, proc: _Process, shard: int, handle: ShardHandle, positions: list[int]
    ) -> dict[int, RawSample]:
        """Parquet: each row group that holds a position read once (one ranged read over S3), then kept."""
        starts = group_starts([rg[2] for rg in handle.entry.row_groups])
        groups: dict[int, list[int]] = {}
        for p in positions:
            groups.setdefault(bisect.bisect_right(starts, p) - 1, []).append(p)
        out: dict[int, RawSample] = {}
        for g, ps in groups.items():
            rows = self._group(proc, shard, handle, g, starts)
            for p in ps:
                out[p] = dict(rows[p - starts[g]])
        return out

    def _group(
        self, proc: _Process, shard: int, handle: ShardHandle, g: int, starts: list[int]
    ) -> list[RawSample]:
        """Row group ``g`` of ``shard``'s rows, from the kept ones or read (by one thread at a time)."""
        with proc.lock:
            rows = proc.groups.get((shard, g))
        if rows is not None:
            return rows
        with handle.lock:
            with proc.lock:  # (another thread may have read it meanwhile)
                rows = proc.groups.get((shard, g))
            if rows is not None:
                return rows
            size = handle.entry.row_groups[g][1]
            # (the format fetches the group's column chunks asked for with one coalesced ranged read)
            rows = handle.load(range(starts[g], starts[g + 1]), self.decoding.columns)
            with proc.lock:
                proc.groups.put((shard, g), rows, size)
        return rows


__all__ = ["MapDataset"]
